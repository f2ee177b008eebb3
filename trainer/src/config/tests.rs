use super::*;
use std::path::Path;

fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("job.toml");
    std::fs::write(&p, text).unwrap();
    (d, p)
}

fn err(text: &str, overrides: &[(&str, &str)]) -> String {
    let (_d, p) = write(text);
    let o: Vec<(String, String)> = overrides.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    // As the command line loads a config: the values, then the model × mesh rules.
    let loaded = load_config(Some(&p), &o).and_then(|c| crate::memory::checks::check(&c));
    format!("{:#}", loaded.err().expect("config should be rejected"))
}

#[test]
fn defaults_file_then_cli_precedence() {
    let (_d, p) = write("[training]\nsteps = 30\nseq_len = 64\n[optimizer]\nlr = 1\n");
    let c = load_config(Some(&p), &[("training.steps".into(), "20".into())]).unwrap();
    assert_eq!(c.training.steps, 20); // CLI beats file
    assert_eq!(c.training.seq_len, 64); // file beats default
    assert_eq!(c.training.local_batch_size, 8); // default
    assert_eq!(c.optimizer.lr, 1.0); // integer accepted for a float
    assert_eq!(load_config(None, &[]).unwrap(), JobConfig::default());
}

#[test]
fn cli_override_forms() {
    let args: Vec<String> =
        ["--training.steps", "20", "--checkpoint.enable=true", "--job.print_config", "--optimizer.betas", "[0.8, 0.9]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let o = parse_overrides(&args).unwrap();
    let c = load_config(None, &o).unwrap();
    assert_eq!(c.training.steps, 20);
    assert!(c.checkpoint.enable && c.job.print_config);
    assert_eq!(c.optimizer.betas, vec![0.8, 0.9]);
    assert!(parse_overrides(&["steps".to_string()]).is_err());
}

#[test]
fn unknown_key_names_file_line_and_closest_key() {
    let e = err("[job]\ndump_folder = \"x\"\n\n[training]\nsteps = 3\nseq_lenn = 64\n", &[]);
    assert!(e.contains("unknown config key `training.seq_lenn`"), "{e}");
    assert!(e.contains("job.toml:6"), "{e}");
    assert!(e.contains("did you mean `training.seq_len`?"), "{e}");
    let e = err("[training]\nlr = 3\n", &[]);
    assert!(e.contains("`lr` belongs in [optimizer]"), "{e}");
}

#[test]
fn unknown_section_names_line_and_closest_section() {
    let e = err("[training]\nsteps = 3\n[optimiser]\nlr = 1\n", &[]);
    assert!(e.contains("unknown config section [optimiser]") && e.contains("job.toml:3"), "{e}");
    assert!(e.contains("did you mean [optimizer]?"), "{e}");
}

#[test]
fn unknown_cli_key_is_reported_as_command_line() {
    let e = err("", &[("training.stepz", "3")]);
    assert!(e.contains("`training.stepz` on the command line") && e.contains("training.steps"), "{e}");
}

#[test]
fn wrong_type_names_key_and_expected_type() {
    let e = err("[training]\nsteps = \"many\"\n", &[]);
    assert!(e.contains("`training.steps`") && e.contains("must be an integer") && e.contains("job.toml:2"), "{e}");
    let e = err("", &[("checkpoint.enable", "yes")]);
    assert!(e.contains("`checkpoint.enable`") && e.contains("must be a boolean"), "{e}");
}

#[test]
fn impossible_values_name_key_and_allowed_values() {
    let e = err("[training]\nsteps = 0\n", &[]);
    assert!(e.contains("`training.steps` = 0 must be a positive integer"), "{e}");
    let e = err("[lr_scheduler]\ndecay_type = \"exp\"\n", &[]);
    assert!(e.contains("`lr_scheduler.decay_type` = \"exp\"") && e.contains("cosine"), "{e}");
    let e = err("[model]\nflavor = \"9B\"\n", &[]);
    assert!(e.contains("`model.flavor`") && e.contains("debugmodel"), "{e}");
    let e = err("[training]\nlocal_batch_size = 4\nglobal_batch_size = 6\n", &[]);
    assert!(e.contains("`training.global_batch_size` = 6") && e.contains("multiple"), "{e}");
}

#[test]
fn parallel_degrees_other_than_one_are_not_supported_yet() {
    let e = err("[parallelism]\nexpert_parallel_degree = 2\ndata_parallel_shard_degree = 2\n", &[]);
    assert!(
        e.contains("`parallelism.expert_parallel_degree` = 2 needs a mixture-of-experts model")
            && e.contains("moe_debug"),
        "{e}"
    );
    let e = err(
        "[model]\nflavor = \"moe_debug\"\n[parallelism]\nexpert_parallel_degree = 3\ndata_parallel_shard_degree = 3\n",
        &[],
    );
    assert!(e.contains("expert_parallel_degree` = 3 does not divide the model's 8 experts"), "{e}");
    // Context parallelism: two chunks per rank, and the rotate method.
    let e = err("[training]\nseq_len = 100\n[parallelism]\ncontext_parallel_degree = 4\n", &[]);
    assert!(
        e.contains("`training.seq_len` = 100") && e.contains("2 · `parallelism.context_parallel_degree` = 8"),
        "{e}"
    );
    let e =
        err("[training]\nseq_len = 96\n[parallelism]\ncontext_parallel_degree = 2\ntensor_parallel_degree = 5\n", &[]);
    assert!(
        e.contains(
            "`parallelism.context_parallel_degree` = 48 must be a multiple of `parallelism.tensor_parallel_degree` = 5"
        ),
        "{e}"
    );
    let e = err("[parallelism]\ncontext_parallel_rotate_method = \"alltoall\"\n", &[]);
    assert!(e.contains("context_parallel_rotate_method") && e.contains("allgather"), "{e}");
    // Sequence parallelism splits the sequence over the TP ranks.
    let e = err("[training]\nseq_len = 130\n[parallelism]\ntensor_parallel_degree = 4\n", &[]);
    assert!(
        e.contains("`training.seq_len` = 130 must be a multiple of `parallelism.tensor_parallel_degree` = 4"),
        "{e}"
    );
    assert!(e.contains("enable_sequence_parallel` = false"), "{e}");
    let e = err("", &[("parallelism.fsdp_reshard_after_forward", "sometimes")]);
    assert!(e.contains("fsdp_reshard_after_forward") && e.contains("\"always\"") && e.contains("\"never\""), "{e}");
    // DDP is supported; the global batch must split evenly over the replicas.
    let e = err(
        "[training]\nlocal_batch_size = 4\nglobal_batch_size = 12\n[parallelism]\ndata_parallel_replicate_degree = 2\n",
        &[],
    );
    assert!(e.contains("data_parallel_replicate_degree × data_parallel_shard_degree = 8"), "{e}");
}

#[test]
fn bad_toml_syntax_names_the_file() {
    let e = err("[training\nsteps = 3\n", &[]);
    assert!(e.contains("job.toml is not valid TOML") && e.contains("line 1"), "{e}");
    let e = format!("{:#}", load_config(Some(Path::new("/no/such.toml")), &[]).err().unwrap());
    assert!(e.contains("/no/such.toml"), "{e}");
}

#[test]
fn printed_config_round_trips() {
    let c = load_config(None, &[("training.steps".into(), "7".into())]).unwrap();
    let (_d, p) = write(&to_toml(&c));
    assert_eq!(load_config(Some(&p), &[]).unwrap(), c);
}

#[test]
fn shipped_configs_load() {
    for f in ["llama_debug.toml", "llama_small.toml"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs").join(f);
        load_config(Some(&p), &[]).unwrap_or_else(|e| panic!("{f}: {e:#}"));
    }
}

#[test]
fn mesh_degrees_are_checked_against_the_model() {
    let e = err("[parallelism]\ntensor_parallel_degree = 3\n", &[]);
    assert!(
        e.contains("tensor_parallel_degree` = 3 does not divide the model's n_heads (16)")
            && e.contains("[1, 2, 4, 8, 16]"),
        "{e}"
    );
    let e = err("[parallelism]\npipeline_parallel_degree = 7\n", &[]);
    assert!(e.contains("exceeds the model's 6 layers"), "{e}");
    let e = err("[parallelism]\ndata_parallel_replicate_degree = 0\n", &[]);
    assert!(e.contains("data_parallel_replicate_degree` = 0 must be >= 1"), "{e}");
}

/// The README's key table against the schema: every key once, no key the schema lacks, each
/// default as the code has it, and for an enumerated key every accepted value named.
#[test]
fn readme_key_table_matches_the_schema() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let mut rows = std::collections::BTreeMap::new();
    let table =
        readme.split("\n## Configuration").nth(1).expect("a Configuration section").split("\n## ").next().unwrap();
    for line in table.lines() {
        let cells: Vec<&str> = line.split(" | ").map(|c| c.trim().trim_matches('|').trim()).collect();
        let Some(key) = cells.first().and_then(|k| k.strip_prefix('`')).and_then(|k| k.strip_suffix('`')) else {
            continue;
        };
        if cells.len() < 3 || !key.contains('.') || key.contains(' ') {
            continue;
        }
        assert!(
            rows.insert(key.to_string(), (cells[1].to_string(), cells[2..].join(" | "))).is_none(),
            "README lists `{key}` twice"
        );
    }
    let defaults = match toml::Value::try_from(JobConfig::default()).unwrap() {
        toml::Value::Table(t) => t,
        _ => unreachable!(),
    };
    let mut schema = std::collections::BTreeMap::new();
    for (section, body) in &defaults {
        for (key, v) in body.as_table().unwrap() {
            schema.insert(format!("{section}.{key}"), v.clone());
        }
    }
    let missing: Vec<_> = schema.keys().filter(|k| !rows.contains_key(*k)).collect();
    let unknown: Vec<_> = rows.keys().filter(|k| !schema.contains_key(*k)).collect();
    assert!(missing.is_empty(), "keys missing from the README's table: {missing:?}");
    assert!(unknown.is_empty(), "the README's table lists keys the schema lacks: {unknown:?}");
    for (key, default) in &schema {
        let (cell, meaning) = &rows[key];
        let cell = cell.trim_matches('`');
        let same = match default {
            toml::Value::String(s) => cell == s || (s.is_empty() && cell == "\"\""),
            toml::Value::Float(f) => cell.parse::<f64>().is_ok_and(|c| c == *f),
            toml::Value::Integer(i) => cell.parse::<i64>().is_ok_and(|c| c == *i),
            toml::Value::Boolean(b) => cell == b.to_string(),
            toml::Value::Array(a) => format!("v = {cell}").parse::<toml::Table>().is_ok_and(|t| {
                t["v"].as_array().is_some_and(|c| {
                    c.len() == a.len()
                        && c.iter().zip(a).all(|(x, y)| {
                            x.as_float().or(x.as_integer().map(|i| i as f64))
                                == y.as_float().or(y.as_integer().map(|i| i as f64))
                                || x == y
                        })
                })
            }),
            _ => true,
        };
        assert!(same, "README: `{key}` default `{cell}`, the schema's is {default}");
        // An enumerated key: every value the loader accepts is named in the meaning.
        if let toml::Value::String(_) = default {
            let o = [(key.clone(), "no-such-value".to_string())];
            let e = load_config(None, &o).err().map(|e| format!("{e:#}")).unwrap_or_default();
            if let Some(list) = e.split("use one of ").nth(1).filter(|_| e.contains("is not supported")) {
                for value in list.trim_matches(|c| c == '[' || c == ']').split(", ").map(|v| v.trim_matches('"')) {
                    assert!(
                        meaning.contains(&format!("`{value}`")),
                        "README: `{key}` does not name the value `{value}`: {meaning}"
                    );
                }
            }
        }
    }
}

/// A single value for a list key is the one-element list, in a file and on the command line.
#[test]
fn a_scalar_for_a_list_key_is_a_one_element_list() {
    let (_d, p) = write("[debug]\nfail_at_steps = 3\n[checkpoint]\nexclude_from_loading = \"optimizer\"\n");
    let c = load_config(Some(&p), &[]).unwrap();
    assert_eq!(c.debug.fail_at_steps, vec![3]);
    assert_eq!(c.checkpoint.exclude_from_loading, vec![LoadablePart::Optimizer]);
    let o = parse_overrides(&["--debug.fail_at_steps".into(), "1".into()]).unwrap();
    assert_eq!(load_config(None, &o).unwrap().debug.fail_at_steps, vec![1]);
    assert_eq!(c.debug.fail_at(), Some(3));
    let e = err("[debug]\nfail_at_steps = \"soon\"\n", &[]);
    assert!(e.contains("`debug.fail_at_steps`") && e.contains("job.toml:2"), "{e}");
}

/// Enumerated keys are typed once at load: a bad value names the key, where it was written and
/// every accepted value; negative counts are refused naming the key.
#[test]
fn enumerated_keys_are_typed_at_load() {
    let c = load_config(None, &[("training.mixed_precision_param".into(), "bfloat16".into())]).unwrap();
    assert_eq!(c.training.mixed_precision_param, Precision::BFloat16);
    assert_eq!(c.training.mixed_precision_param.bytes(), 2);
    let e = err("[training]\nmixed_precision_param = \"fp8\"\n", &[]);
    assert!(e.contains("`training.mixed_precision_param` = \"fp8\" in") && e.contains("job.toml:2"), "{e}");
    assert!(e.contains("[\"float32\", \"bfloat16\", \"float16\"]"), "{e}");
    let e = err("", &[("parallelism.pipeline_parallel_schedule", "ZeroBubble")]);
    assert!(e.contains("on the command line") && e.contains("\"Interleaved1F1B\""), "{e}");
    let e = err("[training]\nseq_len = -3\n", &[]);
    assert!(e.contains("`training.seq_len` = -3") && e.contains("non-negative"), "{e}");
    let e = err("[checkpoint]\nexclude_from_loading = [\"model\", \"weights\"]\n", &[]);
    assert!(e.contains("checkpoint.exclude_from_loading") && e.contains("train_state"), "{e}");
}
