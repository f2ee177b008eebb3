//! `titan-rs train --max-restarts N`: torchrun's restart policy. The job runs as a child process —
//! this binary's ranks as threads, or `--launcher "mpirun …"` in front of it for MPI across
//! hosts — and when it fails (a rank's error, a killed process, a lost host) it is started
//! again, up to `N` times, resuming from the latest complete checkpoint. Each restart is logged
//! with its cause on stderr and in `{dump}/restarts.jsonl`.

use crate::config::JobConfig;
use anyhow::{bail, Context, Result};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use titan_checkpoints::CheckpointFolder;

/// How to start the job again.
pub struct Restarts {
    pub max_restarts: usize,
    /// Words put before this binary (`mpirun -np 4 --hostfile hosts`); empty: run it directly.
    pub launcher: Vec<String>,
    /// The job's `--config` file.
    pub config: Option<PathBuf>,
    /// The job's overrides, without the supervisor's own flags.
    pub overrides: Vec<String>,
}

/// `args` without `--NAME VALUE` / `--NAME=VALUE` for each of `flags`.
pub fn strip_flags(args: &[String], flags: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let name = a.strip_prefix("--").map(|n| n.split_once('=').map_or(n, |(k, _)| k));
        match name {
            Some(n) if flags.contains(&n) => {
                if !a.contains('=') {
                    it.next();
                }
            }
            _ => out.push(a.clone()),
        }
    }
    out
}

/// Runs the job, restarting it after failures; returns when an attempt succeeds, or the error
/// of the last attempt once `max_restarts` restarts are spent.
pub fn supervise(cfg: &JobConfig, r: &Restarts) -> Result<()> {
    if titan_parallel::under_mpi_launcher() {
        bail!(
            "--max-restarts supervises the whole job from outside the launcher: run `titan-rs train --max-restarts N --launcher \"mpirun -np …\" …` instead of starting it under mpirun"
        );
    }
    if !cfg.checkpoint.enable {
        bail!("--max-restarts resumes from checkpoints: set `checkpoint.enable = true` (and a `checkpoint.interval`)");
    }
    let exe = std::env::current_exe().context("locating the titan-rs binary")?;
    let dump = PathBuf::from(&cfg.job.dump_folder);
    let folder = CheckpointFolder::new(dump.join(&cfg.checkpoint.folder));
    for attempt in 0..=r.max_restarts {
        let (status, tail) = run_attempt(&exe, r, attempt)?;
        if status.success() {
            return Ok(());
        }
        let cause = cause(status, &tail);
        if attempt == r.max_restarts {
            bail!(
                "the job failed {} time(s), the restarts (--max-restarts {}) are spent; last failure: {cause}",
                attempt + 1,
                r.max_restarts
            );
        }
        let from = folder.latest().ok().flatten();
        let resume =
            from.map_or("the start (no complete checkpoint yet)".to_string(), |s| format!("checkpoint step-{s}"));
        eprintln!(
            "titan-rs: attempt {} failed ({cause}); restart {} of {} from {resume}",
            attempt + 1,
            attempt + 1,
            r.max_restarts
        );
        log_restart(&dump, attempt + 1, &cause, from)?;
    }
    unreachable!("the last attempt returns")
}

/// One attempt: the child's stderr passes through (and its last lines are kept for the cause).
fn run_attempt(exe: &Path, r: &Restarts, attempt: usize) -> Result<(ExitStatus, Vec<String>)> {
    let mut cmd = match r.launcher.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.arg("train");
    if let Some(c) = &r.config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(&r.overrides).args(["--debug.restart_attempt".to_string(), attempt.to_string()]);
    let mut child = cmd.stderr(Stdio::piped()).spawn().with_context(|| format!("starting {cmd:?}"))?;
    let mut tail = VecDeque::new();
    if let Some(err) = child.stderr.take() {
        let mut out = std::io::stderr();
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            let _ = writeln!(out, "{line}");
            if tail.len() == 200 {
                tail.pop_front();
            }
            tail.push_back(line);
        }
    }
    let status = child.wait().context("waiting for the job")?;
    Ok((status, tail.into()))
}

/// What ended an attempt: how it exited and the line that names the failure (mpirun's report of
/// a dead process, a rank's error, else the last line).
fn cause(status: ExitStatus, tail: &[String]) -> String {
    let how = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    };
    let line = tail
        .iter()
        .find(|l| l.contains("noticed that process rank"))
        .or_else(|| tail.iter().find(|l| l.starts_with("error: rank") || l.starts_with("Error:")))
        .or_else(|| tail.iter().rev().find(|l| !l.trim().is_empty() && !l.starts_with("---")));
    match line {
        Some(l) => format!("{how}: {}", l.trim()),
        None => how,
    }
}

fn log_restart(dump: &Path, restart: usize, cause: &str, from: Option<u64>) -> Result<()> {
    std::fs::create_dir_all(dump)?;
    let path = dump.join("restarts.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let line = serde_json::json!({ "restart": restart, "cause": cause, "resumed_from_step": from });
    writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supervisor_flags_are_removed_from_the_job_arguments() {
        let a: Vec<String> = ["--training.steps", "5", "--max-restarts", "2", "--launcher=mpirun -np 2", "--x.y", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(strip_flags(&a, &["max-restarts", "launcher"]), vec!["--training.steps", "5", "--x.y", "1"]);
    }

    #[test]
    fn the_cause_names_mpiruns_report_or_the_error() {
        let mpirun = vec![
            "step 3 ...".to_string(),
            "mpirun noticed that process rank 3 with PID 0 on node 10.77.0.2 exited on signal 9 (Killed).".to_string(),
        ];
        let c = cause(ExitStatus::from_raw(1 << 8), &mpirun);
        assert!(c.starts_with("exit code 1: mpirun noticed that process rank 3") && c.contains("10.77.0.2"), "{c}");
        let c = cause(ExitStatus::from_raw(9), &["rank 1: killing".to_string()]);
        assert_eq!(c, "killed by signal 9: rank 1: killing");
    }
}
