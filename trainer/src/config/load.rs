//! Building the effective config: defaults < TOML file < command-line overrides, with errors
//! that name the key, where it was written, and what would be valid.

use super::schema::JobConfig;
use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use toml::{Table, Value};

/// Where a value came from, for error messages.
#[derive(Clone, Copy)]
enum Origin<'a> {
    File { path: &'a Path, text: &'a str },
    Cli,
}

impl Origin<'_> {
    fn locate(&self, section: &str, key: Option<&str>) -> String {
        match self {
            Origin::Cli => "on the command line".to_string(),
            Origin::File { path, text } => match find_line(text, section, key) {
                Some(line) => format!("in {}:{line}", path.display()),
                None => format!("in {}", path.display()),
            },
        }
    }
}

/// 1-based line of `[section]` or of `key = …` inside it (also `section.key = …` at top level).
fn find_line(text: &str, section: &str, key: Option<&str>) -> Option<usize> {
    let mut current = String::new();
    let starts_key = |l: &str, k: &str| l.strip_prefix(k).is_some_and(|rest| rest.trim_start().starts_with('='));
    for (i, raw) in text.lines().enumerate() {
        let l = raw.trim();
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.split(']').next()) {
            current = h.trim().to_string();
            if key.is_none() && current == section {
                return Some(i + 1);
            }
            continue;
        }
        match key {
            Some(k) if current == section && starts_key(l, k) => return Some(i + 1),
            Some(k) if current.is_empty() && starts_key(l, &format!("{section}.{k}")) => return Some(i + 1),
            None if current.is_empty() && l.starts_with(&format!("{section}.")) => return Some(i + 1),
            _ => {}
        }
    }
    None
}

fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    candidates
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 3.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn type_name(v: &Value) -> &'static str {
    v.type_str()
}

/// Checks `v` against the default's type; integers are accepted where floats are expected.
fn coerce(key: &str, default: &Value, v: Value, origin: &str) -> Result<Value> {
    match (default, v) {
        (Value::Float(_), Value::Integer(i)) => Ok(Value::Float(i as f64)),
        // A single value for a list key is the one-element list (`fail_at_steps = 3`).
        (Value::Array(d), v) if !matches!(v, Value::Array(_) | Value::Table(_)) => {
            let proto = d.first().cloned().unwrap_or_else(|| v.clone());
            Ok(Value::Array(vec![coerce(key, &proto, v, origin)?]))
        }
        // An empty default (a list of names) takes the items as they are.
        (Value::Array(d), Value::Array(items)) if d.is_empty() => Ok(Value::Array(items)),
        (Value::Array(d), Value::Array(items)) => {
            let proto = d[0].clone();
            let items = items.into_iter().map(|x| coerce(key, &proto, x, origin)).collect::<Result<_>>()?;
            Ok(Value::Array(items))
        }
        (d, v) if std::mem::discriminant(d) == std::mem::discriminant(&v) => Ok(v),
        (d, v) => {
            bail!("config key `{key}` {origin} must be {} (like {d}), not {} {v}", article(type_name(d)), type_name(&v))
        }
    }
}

fn article(t: &str) -> String {
    match t {
        "integer" | "array" => format!("an {t}"),
        _ => format!("a {t}"),
    }
}

/// Merges one section table of overrides into `merged`, checking names and types.
fn merge(merged: &mut Table, defaults: &Table, incoming: Table, origin: Origin) -> Result<()> {
    for (section, body) in incoming {
        let Some(Value::Table(schema)) = defaults.get(&section) else {
            let hint =
                closest(&section, defaults.keys()).map(|c| format!("; did you mean [{c}]?")).unwrap_or_else(|| {
                    format!("; valid sections: {}", defaults.keys().cloned().collect::<Vec<_>>().join(", "))
                });
            bail!("unknown config section [{section}] {}{hint}", origin.locate(&section, None));
        };
        let Value::Table(body) = body else {
            bail!("config entry `{section}` {} must be a [section] table of keys", origin.locate(&section, None));
        };
        let target = merged.get_mut(&section).and_then(Value::as_table_mut).expect("defaults hold every section");
        for (key, value) in body {
            let full = format!("{section}.{key}");
            let Some(default) = schema.get(&key) else {
                let here = origin.locate(&section, Some(&key));
                let hint = match closest(&key, schema.keys()) {
                    Some(c) => format!("; did you mean `{section}.{c}`?"),
                    None => match defaults.iter().find(|(_, t)| t.as_table().is_some_and(|t| t.contains_key(&key))) {
                        Some((other, _)) => format!("; `{key}` belongs in [{other}]"),
                        None => {
                            format!("; keys of [{section}]: {}", schema.keys().cloned().collect::<Vec<_>>().join(", "))
                        }
                    },
                };
                bail!("unknown config key `{full}` {here}{hint}");
            };
            let v = coerce(&full, default, value, &origin.locate(&section, Some(&key)))?;
            target.insert(key, v);
        }
    }
    Ok(())
}

/// Parses `--section.key value` / `--section.key=value` pairs (a bare flag means `true`).
pub fn parse_overrides(args: &[String]) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let Some(flag) = a.strip_prefix("--") else {
            bail!("unexpected argument `{a}`: overrides look like `--section.key value`, e.g. `--training.steps 20`");
        };
        if let Some((k, v)) = flag.split_once('=') {
            out.push((k.to_string(), v.to_string()));
            i += 1;
        } else if i + 1 < args.len() && !args[i + 1].starts_with("--") {
            out.push((flag.to_string(), args[i + 1].clone()));
            i += 2;
        } else {
            out.push((flag.to_string(), "true".to_string()));
            i += 1;
        }
    }
    Ok(out)
}

/// A command-line value as TOML (`3`, `true`, `[1, 2]`), else as the string it is.
fn scalar(raw: &str) -> Value {
    format!("v = {raw}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.into()))
}

/// Turns `(section.key, raw)` overrides into a table shaped like the file, typed by the schema.
fn overrides_table(defaults: &Table, overrides: &[(String, String)]) -> Result<Table> {
    let mut t = Table::new();
    for (path, raw) in overrides {
        let Some((section, key)) = path.split_once('.') else {
            bail!("override `--{path}` must name `section.key`, e.g. `--training.steps 20`");
        };
        let default = defaults.get(section).and_then(|s| s.get(key));
        let value = match default {
            Some(Value::String(_)) => Value::String(raw.clone()),
            // A list also as `a,b` (TorchTitan's command-line form): names or numbers.
            Some(Value::Array(d)) if d.is_empty() && !raw.trim_start().starts_with('[') => {
                Value::Array(raw.split(',').map(|x| x.trim()).filter(|x| !x.is_empty()).map(scalar).collect())
            }
            _ => scalar(raw),
        };
        t.entry(section.to_string())
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .ok_or_else(|| anyhow!("override `--{path}`: `{section}` is not a section"))?
            .insert(key.to_string(), value);
    }
    Ok(t)
}

/// The effective config: defaults, then the TOML file (if any), then the overrides.
pub fn load_config(path: Option<&Path>, overrides: &[(String, String)]) -> Result<JobConfig> {
    let defaults = match Value::try_from(JobConfig::default())? {
        Value::Table(t) => t,
        _ => unreachable!("a struct serializes to a table"),
    };
    let mut merged = defaults.clone();
    if let Some(path) = path {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        let file: Table = text.parse().map_err(|e: toml::de::Error| {
            anyhow!("{} is not valid TOML: {}", path.display(), e.to_string().trim_end())
        })?;
        merge(&mut merged, &defaults, file, Origin::File { path, text: &text })?;
    }
    merge(&mut merged, &defaults, overrides_table(&defaults, overrides)?, Origin::Cli)?;
    let cfg = typed(&merged, &defaults, path, overrides)?;
    super::validate::validate(&cfg)?;
    Ok(cfg)
}

/// The merged table as the typed config. A value the types refuse (a name that is not one of an
/// enumerated key's values, a negative count) is found key by key — each tried alone over the
/// defaults — and named with where it was written and what is accepted.
fn typed(merged: &Table, defaults: &Table, path: Option<&Path>, overrides: &[(String, String)]) -> Result<JobConfig> {
    let first = match Value::Table(merged.clone()).try_into::<JobConfig>() {
        Ok(cfg) => return Ok(cfg),
        Err(e) => e,
    };
    let text = path.and_then(|p| std::fs::read_to_string(p).ok());
    for (section, body) in merged {
        let Some(body) = body.as_table() else { continue };
        for (key, value) in body {
            if defaults.get(section).and_then(|s| s.get(key)) == Some(value) {
                continue;
            }
            let mut alone = defaults.clone();
            alone[section.as_str()].as_table_mut().expect("a section").insert(key.clone(), value.clone());
            let Err(e) = Value::Table(alone).try_into::<JobConfig>() else { continue };
            let on_cli = overrides.iter().any(|(k, _)| *k == format!("{section}.{key}"));
            let origin = match (on_cli, path, &text) {
                (false, Some(path), Some(text)) => Origin::File { path, text },
                _ => Origin::Cli,
            };
            bail!(
                "{}",
                refused(&format!("{section}.{key}"), value, &origin.locate(section, Some(key)), &e.to_string())
            );
        }
    }
    Err(anyhow!("config does not match the schema: {first}"))
}

/// The message for a value the schema's types refuse.
fn refused(key: &str, value: &Value, origin: &str, serde_msg: &str) -> String {
    // serde: "unknown variant `exp`, expected one of `linear`, `sqrt`, `cosine`" (or "expected `llama3`").
    if let Some(expected) = serde_msg.split("unknown variant").nth(1).and_then(|r| r.split("expected").nth(1)) {
        // The list ends with the line (toml may add the key after it).
        let expected = expected.lines().next().unwrap_or("").split(" for key").next().unwrap_or("");
        let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        return format!("`{key}` = {value} {origin} is not supported; use one of {names:?}");
    }
    if serde_msg.contains("invalid value: integer") {
        return format!("`{key}` = {value} {origin} must be a non-negative integer");
    }
    format!("`{key}` = {value} {origin}: {}", serde_msg.lines().next().unwrap_or(serde_msg).trim())
}

/// The config as TOML text (what `titan-rs config` prints and checkpoints store).
pub fn to_toml(cfg: &JobConfig) -> String {
    toml::to_string(cfg).expect("the config serializes")
}
