//! Saving and resuming a rank's training state as a sharded checkpoint.
//!
//! Every rank stages its own parameter pieces and optimizer moments on the host, the ranks
//! agree who writes each piece (replicas once), each writes its file, and rank 0 commits the
//! folder ([`titan_checkpoints::sharded::commit`]). Resuming reads, for each local parameter,
//! the region this rank holds under the *current* layout, from whatever layout saved it (or from
//! a consolidated checkpoint of the previous format). Under `checkpoint.async_mode = "async"`
//! the write runs on a background thread; the ranks commit it at the first step boundary where
//! every rank's writer has finished, or at the next save, or at the end of the run.

mod group;
pub mod pending;
pub mod slots;

use crate::config::to_toml;
use crate::trainer::Trainer;
use crate::state;
use anyhow::{anyhow, bail, Context, Result};
use group::World;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use pending::PendingSave;
use titan_checkpoints::sharded::commit::{finish, prepare, SaveRequest};
use titan_checkpoints::sharded::tools::open_sources;
use titan_checkpoints::{CheckpointFolder, CheckpointReader, TensorSource};
use titan_data::LoaderState;

/// The parts `checkpoint.exclude_from_loading` may name.
pub const LOADABLE_PARTS: [&str; 4] = ["model", "optimizer", "dataloader", "train_state"];

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


impl Trainer {
    fn world(&self) -> World<'_> {
        World(self.rank.world.as_deref())
    }

    /// The mesh, for `checkpoint inspect`.
    fn saved_under(&self) -> String {
        let p = &self.cfg.parallelism;
        format!(
            "pp {} ({}) × dp_replicate {} × dp_shard {} × tp {}, {} rank(s)",
            self.layout.split.pp,
            self.layout.schedule.name(),
            self.rank.dp_degree / self.rank.fsdp.as_ref().map_or(1, |g| g.size()),
            self.rank.fsdp.as_ref().map_or(1, |g| g.size()),
            self.rank.tp.as_ref().map_or(1, |g| g.size()),
            self.world().0.map_or(1, |c| c.size()),
        ) + if p.enable_sequence_parallel && self.rank.tp.is_some() { " (sequence parallel)" } else { "" }
    }

    /// Checkpoints the state after the current step (every rank calls it). Synchronous: returns
    /// the committed folder. Async: stages the state, starts the writer and returns the folder
    /// of the previous background save if this call committed it.
    pub fn save_checkpoint(&mut self) -> Result<Option<PathBuf>> {
        let previous = self.wait_for_pending_save()?;
        let start = Instant::now();
        let model_only = self.cfg.checkpoint.last_save_model_only && self.step == self.cfg.training.steps as u64;
        let slots = slots::slots(&self.model, &self.placement, &self.layout, &self.rank);
        let model = state::model_to_tensors(&self.model);
        let optim = (!model_only).then(|| self.optim.state_dict(&self.model));
        let pieces = slots::pieces(&slots, model, optim);
        let files = if self.rank.world_rank == 0 {
            let ts = TrainState {
                step: self.step,
                optimizer_step: self.optim.step_count(),
                loader: self.loader.state(),
                seed: self.cfg.training.seed as u64,
                flavor: self.cfg.model.flavor.clone(),
            };
            vec![
                ("train_state.json".to_string(), serde_json::to_vec_pretty(&ts)?),
                ("config.toml".to_string(), to_toml(&self.cfg).into_bytes()),
            ]
        } else {
            Vec::new()
        };
        let req = SaveRequest { step: self.step, pieces, files, saved_under: self.saved_under(), model_only };
        let prepared = prepare(&self.checkpoints, &self.world(), req)?;
        let keep = self.cfg.checkpoint.keep_latest_k as usize;
        let kill = self.cfg.debug.kill_during_save_at_step == self.step as i64;
        let write = move || {
            let written = prepared.write();
            if kill {
                // SAFETY: sends a signal to this process; nothing is shared.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            written
        };
        if self.cfg.checkpoint.async_mode == "async" {
            let writer = std::thread::Builder::new()
                .name(format!("checkpoint-step-{}", self.step))
                .spawn(write)
                .context("starting the checkpoint writer thread")?;
            self.pending_save = Some(PendingSave { step: self.step, writer });
            self.checkpoint_blocked += start.elapsed().as_secs_f64();
            return Ok(previous);
        }
        let dir = finish(&self.checkpoints, &self.world(), write(), keep)?;
        self.checkpoint_blocked += start.elapsed().as_secs_f64();
        Ok(Some(dir))
    }

    /// Writes the model of the latest committed checkpoint as a Hugging Face folder
    /// `{checkpoint folder}/step-N-hf` (`checkpoint.last_save_in_hf`; world rank 0 only, after
    /// the save has committed). Returns the folder.
    pub fn export_hf(&mut self) -> Result<Option<PathBuf>> {
        self.wait_for_pending_save()?;
        if self.rank.world_rank != 0 {
            return Ok(None);
        }
        let Some(step) = self.checkpoints.latest()? else { return Ok(None) };
        let dir = self.checkpoints.step_dir(step);
        let out = self.checkpoints.root().join(format!("step-{step}-hf"));
        let sources = open_sources(&dir)?;
        let tokenizer = Some(self.cfg.model.tokenizer_file()).filter(|p| p.exists());
        let o = crate::hf::export::ExportOptions {
            dtype: self.cfg.checkpoint.export_dtype.clone(),
            tokenizer,
            max_position_embeddings: crate::hf::export::max_positions(&self.cfg),
            ..Default::default()
        };
        crate::hf::export::export(sources[0].as_ref(), &self.args, &out, &o)?;
        Ok(Some(out))
    }

    /// The step of the save being written in the background, if any.
    pub fn pending_save_step(&self) -> Option<u64> {
        self.pending_save.as_ref().map(|p| p.step)
    }

    /// Commits the background save if every rank's writer has finished (a collective: every
    /// rank calls it at the same steps); returns its folder when committed.
    pub fn poll_pending_save(&mut self) -> Result<Option<PathBuf>> {
        let Some(p) = &self.pending_save else { return Ok(None) };
        if !self.world().all(p.writer.is_finished())? {
            return Ok(None);
        }
        self.wait_for_pending_save()
    }

    /// Waits for the background save and commits it (every rank calls it).
    pub fn wait_for_pending_save(&mut self) -> Result<Option<PathBuf>> {
        let Some(p) = self.pending_save.take() else { return Ok(None) };
        let start = Instant::now();
        let written = p.writer.join().map_err(|_| anyhow!("the writer thread of checkpoint step-{} panicked", p.step))?;
        let dir = finish(&self.checkpoints, &self.world(), written, self.cfg.checkpoint.keep_latest_k as usize);
        self.checkpoint_blocked += start.elapsed().as_secs_f64();
        dir.map(Some)
    }

    /// Resumes from `checkpoint.load_step` (-1: the latest), if a checkpoint exists.
    pub(crate) fn maybe_resume(&mut self) -> Result<()> {
        let steps = self.checkpoints.steps()?;
        let step = match self.cfg.checkpoint.load_step {
            -1 => match steps.last() {
                Some(s) => *s,
                None if !self.cfg.checkpoint.initial_load_path.is_empty() => return self.initial_load(),
                None => return Ok(()),
            },
            s if steps.contains(&(s as u64)) => s as u64,
            s => bail!(
                "`checkpoint.load_step` = {s} but {} holds steps {steps:?}; use one of them or -1 for the latest",
                self.checkpoints.root().display()
            ),
        };
        let reader = self.checkpoints.open(step)?;
        self.load_from(&reader).with_context(|| format!("cannot resume from {}", reader.dir().display()))?;
        tracing::info!("resumed from {} (step {})", reader.dir().display(), self.step);
        Ok(())
    }

    /// Replaces this rank's parameters with their regions read from `src` (any layout).
    fn load_model(&mut self, src: &dyn TensorSource, slots: &[slots::Slot]) -> Result<()> {
        // A tensor this rank must report as extra: one no stage of the whole model has, or one
        // its own stages should hold (the stages' own keys are its slots).
        let whole: std::collections::HashSet<String> =
            state::param_shapes(&titan_models::Transformer::new(&self.args, 0, &self.device.clone().without_autodiff()))
                .into_iter()
                .map(|(k, _)| k)
                .collect();
        // A tied model reads its head from the embedding; a separate `lm_head` some exports
        // carry anyway is ignored, as transformers does.
        let tied_head = |key: &str| self.args.tie_word_embeddings && key == "output.weight";
        if src.shape("output.weight").is_some() && tied_head("output.weight") {
            tracing::warn!("{}: the model ties its head to the embedding; its separate output head (lm_head) is ignored", src.describe());
        }
        let mine = |key: &str| !tied_head(key) && (!whole.contains(key) || self.layout.local_key(key).is_some());
        let tensors = slots::read_model(src, slots, &mine)?;
        let read: usize = slots.iter().map(|s| s.region.numel()).sum();
        let total: usize = src.shapes().iter().filter(|(k, _)| mine(k) && !k.starts_with("exp_avg")).map(|(_, s)| s.iter().product::<usize>()).sum();
        tracing::info!("rank {}: read {read} of the {total} model values of its stages from {}", self.rank.world_rank, src.describe());
        let model = std::mem::replace(&mut self.model, crate::rank::RankModel { chunks: Vec::new() });
        self.model = state::set_local_tensors(model, tensors, &self.device);
        Ok(())
    }

    /// Starts from `checkpoint.initial_load_path` (no checkpoint of this run exists yet): a
    /// Hugging Face folder (`initial_load_in_hf`, the model only) or a titan-rs step folder
    /// (the model only unless `initial_load_model_only = false`).
    pub(crate) fn initial_load(&mut self) -> Result<()> {
        let k = &self.cfg.checkpoint;
        let path = crate::paths::resolve(&k.initial_load_path);
        let slots = slots::slots(&self.model, &self.placement, &self.layout, &self.rank);
        if k.initial_load_in_hf {
            let src = crate::hf::HfSource::open(&path)
                .with_context(|| format!("`checkpoint.initial_load_path` = {:?} (a Hugging Face folder)", k.initial_load_path))?;
            self.load_model(&src, &slots).context("loading the Hugging Face weights")?;
            tracing::info!("initialised from the Hugging Face model {}", path.display());
            return Ok(());
        }
        let reader = open_step(&path).with_context(|| format!("`checkpoint.initial_load_path` = {:?}", k.initial_load_path))?;
        if !k.initial_load_model_only {
            return self.load_from(&reader).with_context(|| format!("cannot start from {}", reader.dir().display()));
        }
        let sources = open_sources(reader.dir())?;
        self.load_model(sources[0].as_ref(), &slots).with_context(|| format!("cannot start from {}", reader.dir().display()))?;
        tracing::info!("initialised from the model of {}", reader.dir().display());
        Ok(())
    }

    fn load_from(&mut self, r: &CheckpointReader) -> Result<()> {
        let excluded = self.cfg.checkpoint.exclude_from_loading.clone();
        let skip = |part: &str| excluded.iter().any(|x| x == part);
        let ts: TrainState = serde_json::from_slice(&r.read("train_state.json")?)
            .with_context(|| format!("{} is corrupt", r.path("train_state.json").display()))?;
        let sources = open_sources(r.dir())?;
        // Sharded: one source holding both; consolidated: model.safetensors, optimizer.safetensors.
        let (model_src, optim_src) = (sources[0].as_ref(), sources.last().expect("a source").as_ref());
        let slots = slots::slots(&self.model, &self.placement, &self.layout, &self.rank);
        if !skip("model") {
            self.load_model(model_src, &slots).map_err(|e| {
                anyhow!("{e:#}; checkpoint flavor is {:?}, this config's is {:?}", ts.flavor, self.cfg.model.flavor)
            })?;
        }
        let model_only = sources.len() == 1 && !optim_src.shapes().keys().any(|k| k.starts_with("exp_avg."));
        if !skip("optimizer") && ts.optimizer_step > 0 {
            if model_only {
                bail!(
                    "step-{} holds only the model (`checkpoint.last_save_model_only`), no optimizer state to resume from; add \"optimizer\" to `checkpoint.exclude_from_loading` to start a fresh optimizer from it",
                    ts.step
                );
            }
            let moments = slots::read_optimizer(optim_src, &slots)?;
            self.optim
                .load_state_dict(&self.model, ts.optimizer_step, moments, &self.device.clone().without_autodiff())
                .map_err(|e| anyhow!("{}: {e}", optim_src.describe()))?;
        }
        if !skip("dataloader") {
            self.loader.load_state(ts.loader);
        }
        if !skip("train_state") {
            self.step = ts.step;
        }
        Ok(())
    }
}
