//! The root `tests/` folder lives outside this package, so cargo cannot discover its files: each
//! needs a `[[test]]` entry in `trainer/Cargo.toml`. This check fails when a file is missing
//! from that list (it would otherwise never run) or an entry names a file that is gone.

use std::collections::BTreeSet;
use std::path::Path;

/// `(test files in tests/, [[test]] paths in Cargo.toml)`, both as file names. Files that other
/// tests include as modules (`mod common;`) are helpers, not tests.
fn listed_and_present() -> (BTreeSet<String>, BTreeSet<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tests = root.join("../tests");
    let sources: Vec<(String, String)> = std::fs::read_dir(&tests)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    let helpers: BTreeSet<String> = sources
        .iter()
        .flat_map(|(_, text)| {
            text.lines().filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';').map(|m| format!("{m}.rs")))
        })
        .collect();
    let present = sources.into_iter().map(|(name, _)| name).filter(|n| !helpers.contains(n)).collect();
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml")).unwrap().parse().unwrap();
    let listed = manifest["test"]
        .as_array()
        .expect("[[test]] entries")
        .iter()
        .map(|t| {
            let path = t["path"].as_str().expect("a [[test]] path");
            let file =
                path.strip_prefix("../tests/").unwrap_or_else(|| panic!("[[test]] path {path} is outside tests/"));
            assert_eq!(t["name"].as_str(), file.strip_suffix(".rs"), "[[test]] name and file differ for {path}");
            file.to_string()
        })
        .collect();
    (listed, present)
}

#[test]
fn every_file_in_tests_is_a_listed_test_target() {
    let (listed, present) = listed_and_present();
    let missing: Vec<_> = present.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&present).collect();
    assert!(
        missing.is_empty(),
        "tests/{missing:?} has no [[test]] entry in trainer/Cargo.toml, so it never runs; add `[[test]] name = \"…\" path = \"../tests/….rs\"`"
    );
    assert!(stale.is_empty(), "trainer/Cargo.toml lists {stale:?}, which tests/ does not hold");
    assert!(present.len() >= 13, "found only {present:?}");
}
