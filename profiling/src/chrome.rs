//! A rank's recording as Chrome trace-event JSON: one process per rank (`pid` = rank, named by
//! a metadata event), complete (`"ph": "X"`) events in microseconds.

use crate::Event;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;

/// What one rank recorded.
#[derive(Debug, Clone)]
pub struct Trace {
    pub rank: usize,
    pub label: String,
    pub events: Vec<Event>,
}

impl Trace {
    /// The trace-event JSON object.
    pub fn to_json(&self) -> Value {
        let pid = self.rank;
        let mut events = vec![
            json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": self.label}}),
            json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}),
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "main"}}),
        ];
        if self.events.iter().any(|e| e.lane == crate::COMM_LANE) {
            events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": crate::COMM_LANE, "args": {"name": "comm stream"}}));
        }
        for e in &self.events {
            let args: Map<String, Value> = e.args.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            events.push(json!({
                "name": e.name, "cat": e.cat, "ph": "X", "pid": pid, "tid": e.lane,
                "ts": (e.ts_us * 1000.0).round() / 1000.0, "dur": (e.dur_us * 1000.0).round() / 1000.0,
                "args": args,
            }));
        }
        json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"rank": pid, "producer": "titan-rs"}})
    }

    /// Writes the JSON to `path` atomically (a temporary file renamed into place).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            serde_json::to_writer(&mut f, &self.to_json())?;
            f.flush()?;
        }
        std::fs::rename(&tmp, path)
    }
}

/// The names of the complete events in a trace file, in file order (for checks and tools).
pub fn read_span_names(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let events = v["traceEvents"].as_array().ok_or_else(|| format!("{} has no traceEvents array", path.display()))?;
    Ok(events.iter().filter(|e| e["ph"] == "X").filter_map(|e| e["name"].as_str().map(str::to_string)).collect())
}
