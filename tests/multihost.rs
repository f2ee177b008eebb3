//! MPI across separate network hosts: Linux network namespaces made by
//! `scripts/netns_hosts.sh` (own network stack, hostname and address each; TCP over veth links
//! to a bridge; no shared memory between hosts), `mpirun` reaching them through the namespace
//! launch agent. Needs root and iproute2 (CI runs as root; `.ci/run` installs iproute2); without
//! them the test says so and checks nothing. Built with `--features mpi`.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

/// Namespace hosts for one test, removed when dropped (also when the test fails).
struct Hosts {
    prefix: String,
    hostfile: std::path::PathBuf,
}

fn script() -> std::path::PathBuf {
    repo().join("scripts/netns_hosts.sh")
}

impl Hosts {
    /// `n` hosts with `slots` ranks each; `None` where this machine cannot make them.
    fn up(n: usize, slots: usize, dir: &Path) -> Option<Self> {
        // SAFETY: reads the effective user id.
        if unsafe { libc::geteuid() } != 0 || Command::new("ip").arg("-V").output().is_err() {
            eprintln!("SKIPPED: network namespaces need root and iproute2 (CI has both)");
            return None;
        }
        let prefix = format!("t{}", std::process::id() % 100_000);
        let st = Command::new(script()).args(["up", &prefix, &n.to_string()]).status().expect("netns_hosts.sh");
        assert!(st.success(), "netns_hosts.sh up failed");
        let hosts = Hosts { prefix, hostfile: dir.join("hostfile") };
        let o = Command::new(script()).args(["hostfile", &hosts.prefix, &n.to_string(), &slots.to_string()]).output().unwrap();
        std::fs::write(&hosts.hostfile, &o.stdout).unwrap();
        Some(hosts)
    }

    /// The launcher words: mpirun from host 0 over the namespace links.
    fn launcher(&self, np: usize) -> Vec<String> {
        let s = script().display().to_string();
        [s.as_str(), "mpirun", &self.prefix, "--hostfile", &self.hostfile.display().to_string(), "-np", &np.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// `titan-rs ARGS` as `np` MPI ranks across the hosts (killed after 180 s at worst).
    fn mpirun(&self, np: usize, args: &[String]) -> Output {
        Command::new("timeout")
            .arg("180")
            .args(self.launcher(np))
            .arg(env!("CARGO_BIN_EXE_titan-rs"))
            .args(args)
            .current_dir(repo())
            .env("RUST_LOG", "warn")
            .output()
            .expect("run mpirun")
    }

    /// `tc qdisc replace dev eth0 root ARGS` on host `i`.
    fn shape(&self, i: usize, args: &[&str]) -> bool {
        Command::new(script()).args(["shape", &self.prefix, &i.to_string()]).args(args).status().unwrap().success()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = Command::new(script()).args(["down", &self.prefix]).status();
    }
}

fn args(dump: &Path, steps: u32, extra: &str) -> Vec<String> {
    let mut a = tiny_args(dump, steps);
    a.extend(extra.split_whitespace().map(String::from));
    a
}

/// (loss, grad norm) per step, the last line of each step (a restarted job logs again the
/// steps after its checkpoint).
fn steps(dump: &Path) -> Vec<(f64, f64)> {
    let mut by_step = std::collections::BTreeMap::new();
    for (s, l, g) in losses(dump) {
        by_step.insert(s, (l.parse().unwrap(), g.parse().unwrap()));
    }
    by_step.into_values().collect()
}

const FSDP_TP: &str = "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2 --training.local_batch_size 4";
const PP_FSDP: &str = "--parallelism.data_parallel_shard_degree 2 --parallelism.pipeline_parallel_degree 2 --training.local_batch_size 4";
const CK: &str = "--checkpoint.enable true --checkpoint.interval 2 --comm.train_timeout_seconds 30";

/// 2 hosts × 2 ranks: FSDP 2 × TP 2 equals one rank; its checkpoint resumes as PP 2 × FSDP 2
/// across the hosts; a shaped link gives the same steps bit for bit; a process killed on host 2
/// ends every rank within `comm.train_timeout_seconds` with its rank and host named; and
/// `--max-restarts 2` through two killed processes gives the uninterrupted run's steps exactly.
#[test]
fn training_across_namespace_hosts() {
    let d = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::up(2, 2, d.path()) else { return };
    let single = layout_run(&d.path().join("single"), "--parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8", 4);

    // FSDP × TP across hosts, stopped at its step-2 checkpoint, then continued.
    let fsdp_tp = d.path().join("fsdp-tp");
    let out = assert_ok(&hosts.mpirun(4, &args(&fsdp_tp, 4, &format!("{FSDP_TP} {CK} --debug.stop_at_step 2"))));
    assert!(out.contains("done at step 2"), "{out}");
    let resumed_pp = d.path().join("pp-fsdp");
    copy_dir(&fsdp_tp, &resumed_pp);
    assert_ok(&hosts.mpirun(4, &args(&fsdp_tp, 4, &format!("{FSDP_TP} {CK}"))));
    let straight = steps(&fsdp_tp);
    assert_matches("FSDP 2 × TP 2 on 2 hosts", &single, &straight, 1e-5);
    // The checkpoint written across hosts resumes under PP 2 × FSDP 2 across hosts.
    assert_ok(&hosts.mpirun(4, &args(&resumed_pp, 4, &format!("{PP_FSDP} {CK}"))));
    assert_matches("resumed as PP 2 × FSDP 2 on 2 hosts", &single, &steps(&resumed_pp), 1e-5);

    // A shaped link (netem delay and loss where the kernel has it, else a token bucket): slower,
    // the same steps.
    let shaped = if hosts.shape(1, &["netem", "delay", "5ms", "loss", "1%"]) {
        "netem delay 5ms loss 1%"
    } else {
        assert!(hosts.shape(1, &["tbf", "rate", "50mbit", "burst", "64kb", "latency", "100ms"]), "tc tbf");
        "tbf 50 Mbit/s (this kernel has no sch_netem)"
    };
    let shaped_dump = d.path().join("shaped");
    assert_ok(&hosts.mpirun(4, &args(&shaped_dump, 4, &format!("{FSDP_TP} --debug.stop_at_step 2"))));
    assert_eq!(steps(&shaped_dump), straight[..2], "{shaped}: steps changed");
    // Straggler detection on the shaped link: every rank waits on the link (nobody is named for
    // that), and a rank computing 0.2 s more per step is named with its host regardless.
    for (slow, want) in [("", None), ("--debug.slow_rank 3 --debug.slow_seconds 0.2", Some("10.77.0.2"))] {
        let dump = d.path().join(format!("straggler{}", want.is_some()));
        let flags = format!("--parallelism.data_parallel_shard_degree 4 --training.local_batch_size 2 --metrics.log_freq 2 --fault.straggler_windows 2 {slow}");
        assert_ok(&hosts.mpirun(4, &args(&dump, 6, &flags)));
        let named: Vec<serde_json::Value> = metric_lines(&dump).into_iter().filter_map(|l| l.get("stragglers").cloned()).collect();
        match want {
            None => assert!(named.is_empty(), "{shaped}: a slow link named {named:?}"),
            Some(host) => assert!(
                named.iter().flat_map(|n| n.as_array().unwrap()).any(|x| x["rank"] == 3 && x["host"] == host),
                "{shaped}: rank 3 not named: {named:?}"
            ),
        }
    }
    assert!(hosts.shape(1, &["pfifo"]), "removing the shaping");

    // A process killed mid-step on host 2: every rank ends, the rank and host named.
    let t = Instant::now();
    let o = hosts.mpirun(4, &args(&d.path().join("killed"), 4, &format!("{FSDP_TP} {CK} --debug.fail_at_steps [2] --debug.fail_rank 3")));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(t.elapsed().as_secs() < 30, "took {:?} (comm.train_timeout_seconds = 30)", t.elapsed());
    assert!(err.contains("process rank 3") && err.contains("node 10.77.0.2"), "mpirun's report lacks rank 3 and its host:\n{err}");

    // Elastic restart: rank 3's process killed at step 2, then (after the restart from step 0)
    // at step 3; two restarts, the second from the step-2 checkpoint; the uninterrupted run's
    // steps bit for bit.
    let elastic = d.path().join("elastic");
    let mut a = args(&elastic, 4, &format!("{FSDP_TP} {CK} --debug.fail_at_steps [2,3] --debug.fail_rank 3"));
    a.extend(["--max-restarts".into(), "2".into(), "--launcher".into(), hosts.launcher(4).join(" ")]);
    let o = run(&a, &[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_ok(&o);
    assert_eq!(err.matches("titan-rs: attempt").count(), 2, "{err}");
    let log = std::fs::read_to_string(elastic.join("restarts.jsonl")).unwrap();
    assert_eq!(log.lines().count(), 2, "{log}");
    assert!(log.contains("process rank 3") && log.contains("node 10.77.0.2"), "{log}");
    assert_eq!(steps(&elastic), straight, "restarted run vs uninterrupted");
}
