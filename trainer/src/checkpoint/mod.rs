//! Saving and resuming a rank's training state as a sharded checkpoint.
//!
//! Every rank stages its own parameter pieces and optimizer moments on the host, the ranks
//! agree who writes each piece (replicas once), each writes its file, and rank 0 commits the
//! folder ([`titan_checkpoints::sharded::commit`]). Resuming reads, for each local parameter,
//! the region this rank holds under the *current* layout, from whatever layout saved it (or from
//! a consolidated checkpoint of the previous format). Under `checkpoint.async_mode = "async"`
//! the write runs on a background thread; the ranks commit it at the first step boundary where
//! every rank's writer has finished, or at the next save, or at the end of the run.
//!
//! The [`Checkpointer`] owns the folder and the save in flight; the trainer lends it the state
//! to save or fill ([`TrainingState`]).

mod group;
mod pending;
mod restore;
pub mod slots;

pub use restore::initial_load;

use crate::config::{to_toml, AsyncMode, JobConfig};
use crate::optim::Optimizers;
use crate::rank::parallelize::Placement;
use crate::rank::pipeline::RankLayout;
use crate::rank::{params, RankContext, RankModel};
use anyhow::{anyhow, bail, Context, Result};
use burn::prelude::Device;
use group::World;
use pending::PendingSave;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use titan_checkpoints::sharded::commit::{finish, prepare, SaveRequest};
use titan_checkpoints::sharded::tools::open_sources;
use titan_checkpoints::{CheckpointFolder, CheckpointReader};
use titan_data::{DataLoader, LoaderState};
use crate::optim::loss_scale::{LossScaleState, LossScaler};
use crate::optim::loss_spike::LossSpikes;
use titan_models::ModelArgs;

/// Everything in a checkpoint besides tensors.
#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    step: u64,
    optimizer_step: u64,
    loader: LoaderState,
    /// The only randomness in training is the seeded sample order (no dropout), so the seed and
    /// the loader state are the complete RNG state.
    seed: u64,
    flavor: String,
    /// float16's dynamic loss scale (absent in checkpoints of runs without it).
    #[serde(default)]
    loss_scale: Option<LossScaleState>,
    /// Loss-spike history and the data windows rollbacks skipped (absent in older checkpoints).
    #[serde(default)]
    loss_spikes: LossSpikes,
}

/// A rank's training state as a checkpoint sees it, borrowed from the trainer: what a save
/// reads and a resume fills.
pub struct TrainingState<'a> {
    pub cfg: &'a JobConfig,
    pub args: &'a ModelArgs,
    pub model: &'a mut RankModel,
    pub optim: &'a mut Optimizers,
    pub loader: &'a mut DataLoader,
    /// Steps completed.
    pub step: &'a mut u64,
    pub placement: &'a Placement,
    pub layout: &'a RankLayout,
    pub rank: &'a RankContext,
    pub device: &'a Device,
    pub scaler: &'a mut LossScaler,
    pub spikes: &'a mut LossSpikes,
}

/// Opens (verified) a `step-N` folder, or the latest step in a folder holding them, or in a
/// dump folder's `checkpoint/`.
pub fn open_step(path: &Path) -> Result<CheckpointReader> {
    let (root, step) = if path.join("manifest.json").exists() {
        let step = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| anyhow!("{} is not a step-N folder", path.display()))?;
        (path.parent().unwrap_or(Path::new(".")).to_path_buf(), step)
    } else {
        let found = [path.to_path_buf(), path.join("checkpoint")]
            .into_iter()
            .find_map(|root| Some((CheckpointFolder::new(&root).latest().ok()??, root)));
        let Some((step, root)) = found else {
            bail!("no checkpoint in {} (expected a step-N folder or a folder holding them)", path.display())
        };
        (root, step)
    };
    CheckpointFolder::new(root).open(step)
}

/// A run's checkpoint folder and the save being written in the background, if any.
pub struct Checkpointer {
    folder: CheckpointFolder,
    pending: Option<PendingSave>,
    /// Seconds training has waited for saves (staging, writing when synchronous, committing).
    blocked: f64,
    /// `checkpoint.keep_latest_k`: committing a save prunes all but the newest k.
    keep_latest_k: usize,
}

fn world(rank: &RankContext) -> World<'_> {
    World(rank.world.as_deref())
}

impl Checkpointer {
    /// The folder `checkpoint.folder` under `job.dump_folder`.
    pub fn new(cfg: &JobConfig) -> Self {
        let folder = CheckpointFolder::new(PathBuf::from(&cfg.job.dump_folder).join(&cfg.checkpoint.folder));
        Self { folder, pending: None, blocked: 0.0, keep_latest_k: cfg.checkpoint.keep_latest_k }
    }

    pub fn folder(&self) -> &CheckpointFolder {
        &self.folder
    }

    /// Seconds training has waited for checkpoint saves so far.
    pub fn blocked_seconds(&self) -> f64 {
        self.blocked
    }

    /// Checkpoints the state after the current step (every rank calls it). Synchronous: returns
    /// the committed folder. Async: stages the state, starts the writer and returns the folder
    /// of the previous background save if this call committed it.
    pub fn save(&mut self, s: &TrainingState) -> Result<Option<PathBuf>> {
        let previous = self.wait(s.rank)?;
        let start = Instant::now();
        let (cfg, step) = (s.cfg, *s.step);
        let model_only = cfg.checkpoint.last_save_model_only && step == cfg.training.steps;
        let slots = slots::slots(s.model, s.placement, s.layout, s.rank);
        let model = params::model_to_tensors(s.model);
        let optim = (!model_only).then(|| s.optim.state_dict(s.model));
        let pieces = slots::pieces(&slots, model, optim);
        let files = if s.rank.world_rank == 0 {
            let ts = TrainState {
                step,
                optimizer_step: s.optim.step_count(),
                loader: s.loader.state(),
                seed: cfg.training.seed,
                flavor: cfg.model.flavor.clone(),
                loss_scale: s.scaler.state(),
                loss_spikes: s.spikes.clone(),
            };
            vec![
                ("train_state.json".to_string(), serde_json::to_vec_pretty(&ts)?),
                ("config.toml".to_string(), to_toml(cfg).into_bytes()),
            ]
        } else {
            Vec::new()
        };
        let req = SaveRequest { step, pieces, files, saved_under: saved_under(s), model_only };
        let prepared = prepare(&self.folder, &world(s.rank), req)?;
        let keep = self.keep_latest_k;
        let kill = cfg.debug.kill_during_save_at() == Some(step);
        let write = move || {
            let written = prepared.write();
            if kill {
                // SAFETY: sends a signal to this process; nothing is shared.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            written
        };
        if cfg.checkpoint.async_mode == AsyncMode::Async {
            let writer = std::thread::Builder::new()
                .name(format!("checkpoint-step-{step}"))
                .spawn(write)
                .context("starting the checkpoint writer thread")?;
            self.pending = Some(PendingSave { step, writer });
            self.blocked += start.elapsed().as_secs_f64();
            return Ok(previous);
        }
        let dir = finish(&self.folder, &world(s.rank), write(), keep)?;
        self.blocked += start.elapsed().as_secs_f64();
        Ok(Some(dir))
    }

    /// Writes the model of the latest committed checkpoint as a Hugging Face folder
    /// `{checkpoint folder}/step-N-hf` (`checkpoint.last_save_in_hf`; world rank 0 only, after
    /// the save has committed). Returns the folder.
    pub fn export_hf(&mut self, cfg: &JobConfig, args: &ModelArgs, rank: &RankContext) -> Result<Option<PathBuf>> {
        self.wait(rank)?;
        if rank.world_rank != 0 {
            return Ok(None);
        }
        let Some(step) = self.folder.latest()? else { return Ok(None) };
        let dir = self.folder.step_dir(step);
        let out = self.folder.root().join(format!("step-{step}-hf"));
        let sources = open_sources(&dir)?;
        let tokenizer = Some(cfg.model.tokenizer_file()).filter(|p| p.exists());
        let o = crate::hf::export::ExportOptions {
            dtype: cfg.checkpoint.export_dtype,
            tokenizer,
            max_position_embeddings: crate::hf::export::max_positions(cfg),
            ..Default::default()
        };
        crate::hf::export::export(sources[0].as_ref(), args, &out, &o)?;
        Ok(Some(out))
    }

    /// The step of the save being written in the background, if any.
    pub fn pending_step(&self) -> Option<u64> {
        self.pending.as_ref().map(|p| p.step)
    }

    /// Commits the background save if every rank's writer has finished (a collective: every
    /// rank calls it at the same steps); returns its folder when committed.
    pub fn poll(&mut self, rank: &RankContext) -> Result<Option<PathBuf>> {
        let Some(p) = &self.pending else { return Ok(None) };
        if !world(rank).all(p.writer.is_finished())? {
            return Ok(None);
        }
        self.wait(rank)
    }

    /// Waits for the background save and commits it (every rank calls it).
    pub fn wait(&mut self, rank: &RankContext) -> Result<Option<PathBuf>> {
        let Some(p) = self.pending.take() else { return Ok(None) };
        let start = Instant::now();
        let written =
            p.writer.join().map_err(|_| anyhow!("the writer thread of checkpoint step-{} panicked", p.step))?;
        let dir = finish(&self.folder, &world(rank), written, self.keep_latest_k);
        self.blocked += start.elapsed().as_secs_f64();
        dir.map(Some)
    }
}

/// The mesh a save was taken under, for `checkpoint inspect`.
fn saved_under(s: &TrainingState) -> String {
    let d = &s.rank.dims;
    let sp = if s.placement.sequence_parallel() { " (sequence parallel)" } else { "" };
    format!("{}{sp}, pipeline schedule {}", d.describe(), s.layout.schedule.name())
}
