use super::*;

#[test]
fn spans_record_only_while_started_and_nest_in_time() {
    {
        let _s = span("before", "step");
    }
    start(3, "rank 3");
    {
        let _outer = span("step", "step").arg("step", 7);
        let _inner = span_with(|| format!("layers.{}.forward", 2), "forward");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let t = finish().expect("a trace");
    assert_eq!(t.rank, 3);
    let names: Vec<_> = t.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["step", "layers.2.forward"]);
    let (outer, inner) = (&t.events[0], &t.events[1]);
    assert!(inner.ts_us >= outer.ts_us && inner.ts_us + inner.dur_us <= outer.ts_us + outer.dur_us + 1e-3);
    assert!(inner.dur_us >= 2000.0, "slept 2 ms, measured {} µs", inner.dur_us);
    assert_eq!(outer.args[0].1, serde_json::json!(7));
    assert!(finish().is_none(), "finish stops recording");
    let _after = span("after", "step");
    assert!(!is_active());
}

#[test]
fn markers_open_and_close_keyed_spans_and_unclosed_ones_are_flagged() {
    assert_eq!(marker("x", Boundary::Begin), None, "no markers while not recording");
    start(0, "rank 0");
    let open = marker("layers.1.backward", Boundary::Begin).unwrap();
    let close = marker("layers.1.backward", Boundary::End).unwrap();
    on_marker(open, "backward");
    on_marker(close, "backward");
    begin("never closed", "pipeline");
    end("never opened");
    let t = finish().unwrap();
    let names: Vec<_> = t.events.iter().map(|e| (e.name.as_str(), e.cat, e.args.len())).collect();
    assert_eq!(names, [("layers.1.backward", "backward", 0), ("never closed", "pipeline", 1)]);
}

#[test]
fn the_json_is_valid_trace_event_format_and_reads_back() {
    start(1, "rank 1 (tp 1)");
    {
        let _s = span("all_gather", "comm").arg("bytes", 4096).arg("peers", "[0, 1]");
    }
    let t = finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("iteration_5").join("rank1_trace.json");
    t.write(&path).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let x = events.iter().find(|e| e["ph"] == "X").unwrap();
    assert_eq!((x["pid"].as_u64(), x["cat"].as_str(), x["args"]["bytes"].as_u64()), (Some(1), Some("comm"), Some(4096)));
    assert!(x["ts"].as_f64().unwrap() > 1.6e15, "timestamps are µs since the epoch");
    let meta = events.iter().find(|e| e["name"] == "process_name").unwrap();
    assert_eq!(meta["args"]["name"], "rank 1 (tp 1)");
    assert_eq!(read_span_names(&path).unwrap(), ["all_gather"]);
    assert!(!path.with_extension("json.tmp").exists());
}
