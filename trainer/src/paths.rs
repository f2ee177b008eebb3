//! Resolving the paths a config names: relative to the working directory first, then to the
//! titan-rs source tree (so built-in assets work from any directory of a fresh clone).

use std::path::{Path, PathBuf};

/// Built-in corpora shipped in `assets/`.
pub fn builtin_dataset(name: &str) -> Option<&'static str> {
    match name {
        "shakespeare" => Some("assets/shakespeare/train.txt"),
        "shakespeare_valid" => Some("assets/shakespeare/valid.txt"),
        _ => None,
    }
}

/// `p` if it exists relative to the working directory, else the same path under the source tree.
pub fn resolve(p: &str) -> PathBuf {
    let direct = PathBuf::from(p);
    if direct.exists() || direct.is_absolute() {
        return direct;
    }
    let in_tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p);
    if in_tree.exists() {
        in_tree
    } else {
        direct
    }
}

/// The corpus for a `(dataset, dataset_path)` pair.
pub fn dataset(name: &str, path: &str) -> PathBuf {
    if !path.is_empty() {
        return resolve(path);
    }
    resolve(builtin_dataset(name).unwrap_or(name))
}
