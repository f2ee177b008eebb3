//! Resuming: a run's own checkpoint (`checkpoint.load_step`), or the weights it starts from
//! (`checkpoint.initial_load_path`: a titan-rs step folder or a Hugging Face folder), read for
//! this rank's layout whatever layout wrote them.

use super::{open_step, slots, Checkpointer, TrainState, TrainingState};
use crate::config::LoadablePart;
use crate::rank::{params, RankModel};
use anyhow::{anyhow, bail, Context, Result};
use titan_checkpoints::sharded::tools::open_sources;
use titan_checkpoints::{CheckpointReader, TensorSource};

impl Checkpointer {
    /// Resumes from `checkpoint.load_step` (-1: the latest) if the folder holds a checkpoint,
    /// else starts from `checkpoint.initial_load_path` if one is set.
    pub fn resume(&self, s: &mut TrainingState) -> Result<()> {
        let steps = self.folder.steps()?;
        let step = match s.cfg.checkpoint.load_step() {
            None => match steps.last() {
                Some(step) => *step,
                None if !s.cfg.checkpoint.initial_load_path.is_empty() => return initial_load(s),
                None => return Ok(()),
            },
            Some(step) if steps.contains(&step) => step,
            Some(step) => bail!(
                "`checkpoint.load_step` = {step} but {} holds steps {steps:?}; use one of them or -1 for the latest",
                self.folder.root().display()
            ),
        };
        let reader = self.folder.open(step)?;
        load_from(s, &reader).with_context(|| format!("cannot resume from {}", reader.dir().display()))?;
        tracing::info!("resumed from {} (step {})", reader.dir().display(), s.step);
        Ok(())
    }
}

impl Checkpointer {
    /// Loss-spike rollback: loads the latest checkpoint before step `before` into `s`; with
    /// `discard` (one rank) the later checkpoints are removed. Returns the step loaded.
    pub fn roll_back(&self, s: &mut TrainingState, before: u64, discard: bool) -> Result<u64> {
        let steps = self.folder.steps()?;
        let Some(&target) = steps.iter().rev().find(|&&k| k < before) else {
            bail!(
                "a loss spike from step {before} on calls for a rollback, but {} holds no checkpoint before step {before} (it holds {steps:?}); checkpoint more often (`checkpoint.interval`) or raise `fault.loss_spike_zscore`",
                self.folder.root().display()
            );
        };
        let reader = self.folder.open(target)?;
        load_from(s, &reader).with_context(|| format!("cannot roll back to {}", reader.dir().display()))?;
        if discard {
            self.folder.discard_after(target)?;
        }
        Ok(target)
    }
}

/// Replaces this rank's parameters with their regions read from `src` (any layout).
fn load_model(s: &mut TrainingState, src: &dyn TensorSource, slots: &[slots::Slot]) -> Result<()> {
    // A tensor this rank must report as extra: one no stage of the whole model has, or one
    // its own stages should hold (the stages' own keys are its slots).
    let whole: std::collections::HashSet<String> =
        params::param_shapes(&titan_models::Transformer::new(s.args, 0, &s.device.clone().without_autodiff()))
            .into_iter()
            .map(|(k, _)| k)
            .collect();
    // A tied model reads its head from the embedding; a separate `lm_head` some exports
    // carry anyway is ignored, as transformers does.
    let tied_head = |key: &str| s.args.tie_word_embeddings && key == "output.weight";
    if src.shape("output.weight").is_some() && tied_head("output.weight") {
        tracing::warn!(
            "{}: the model ties its head to the embedding; its separate output head (lm_head) is ignored",
            src.describe()
        );
    }
    let mine = |key: &str| !tied_head(key) && (!whole.contains(key) || s.layout.local_key(key).is_some());
    let tensors = slots::read_model(src, slots, &mine)?;
    let read: usize = slots.iter().map(|s| s.region.numel()).sum();
    let total: usize = src
        .shapes()
        .iter()
        .filter(|(k, _)| mine(k) && !crate::optim::is_state_key(k))
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    tracing::info!(
        "rank {}: read {read} of the {total} model values of its stages from {}",
        s.rank.world_rank,
        src.describe()
    );
    let model = std::mem::replace(s.model, RankModel { chunks: Vec::new() });
    *s.model = params::set_local_tensors(model, tensors, s.device);
    Ok(())
}

/// Starts from `checkpoint.initial_load_path` (no checkpoint of this run exists yet): a
/// Hugging Face folder (`initial_load_in_hf`, the model only) or a titan-rs step folder
/// (the model only unless `initial_load_model_only = false`).
pub fn initial_load(s: &mut TrainingState) -> Result<()> {
    let k = &s.cfg.checkpoint;
    let path = crate::paths::resolve(&k.initial_load_path);
    let slots = slots::slots(s.model, s.placement, s.layout, s.rank);
    if k.initial_load_in_hf {
        let src = crate::hf::HfSource::open(&path).with_context(|| {
            format!("`checkpoint.initial_load_path` = {:?} (a Hugging Face folder)", k.initial_load_path)
        })?;
        load_model(s, &src, &slots).context("loading the Hugging Face weights")?;
        tracing::info!("initialised from the Hugging Face model {}", path.display());
        return Ok(());
    }
    let reader =
        open_step(&path).with_context(|| format!("`checkpoint.initial_load_path` = {:?}", k.initial_load_path))?;
    if !k.initial_load_model_only {
        return load_from(s, &reader).with_context(|| format!("cannot start from {}", reader.dir().display()));
    }
    let sources = open_sources(reader.dir())?;
    load_model(s, sources[0].as_ref(), &slots)
        .with_context(|| format!("cannot start from {}", reader.dir().display()))?;
    tracing::info!("initialised from the model of {}", reader.dir().display());
    Ok(())
}

fn load_from(s: &mut TrainingState, r: &CheckpointReader) -> Result<()> {
    let excluded = s.cfg.checkpoint.exclude_from_loading.clone();
    let skip = |part: LoadablePart| excluded.contains(&part);
    let ts: TrainState = serde_json::from_slice(&r.read("train_state.json")?)
        .with_context(|| format!("{} is corrupt", r.path("train_state.json").display()))?;
    let sources = open_sources(r.dir())?;
    // Sharded: one source holding both; consolidated: model.safetensors, optimizer.safetensors.
    let (model_src, optim_src) = (sources[0].as_ref(), sources.last().expect("a source").as_ref());
    let slots = slots::slots(s.model, s.placement, s.layout, s.rank);
    if !skip(LoadablePart::Model) {
        load_model(s, model_src, &slots).map_err(|e| {
            anyhow!("{e:#}; checkpoint flavor is {:?}, this config's is {:?}", ts.flavor, s.cfg.model.flavor)
        })?;
    }
    let model_only = sources.len() == 1 && !optim_src.shapes().keys().any(|k| crate::optim::is_state_key(k));
    if !skip(LoadablePart::Optimizer) && ts.optimizer_step > 0 {
        if model_only {
            bail!(
                    "step-{} holds only the model (`checkpoint.last_save_model_only`), no optimizer state to resume from; add \"optimizer\" to `checkpoint.exclude_from_loading` to start a fresh optimizer from it",
                    ts.step
                );
        }
        let moments = slots::read_optimizer(optim_src, &slots)?;
        s.optim
            .load_state_dict(s.model, ts.optimizer_step, moments, &s.device.clone().without_autodiff())
            .map_err(|e| anyhow!("{}: {e}", optim_src.describe()))?;
    }
    if !skip(LoadablePart::Dataloader) {
        s.loader.load_state(ts.loader);
    }
    if !skip(LoadablePart::TrainState) {
        *s.step = ts.step;
        s.scaler.load(ts.loss_scale);
        *s.spikes = ts.loss_spikes;
    }
    Ok(())
}
