//! The training state of one rank and the operations on it: build (or resume), one optimizer
//! step, validation, checkpoint.

use crate::checkpoint::{Checkpointer, TrainingState};
use crate::config::{AttentionChoice, DeviceKind, FailMode, JobConfig, LossScaleMode, MaskType, Precision, SdcAction};
use crate::metrics::StepStats;
use crate::optim::loss_scale::{LossScaler, Verdict, MAX_CONSECUTIVE_SKIPS};
use crate::optim::loss_spike::{LossSpikes, SkippedWindow};
use crate::optim::LrSchedule;
use crate::optim::Optimizers;
use crate::paths;
use crate::rank::grads;
use crate::rank::parallelize::{parallelize_llama, ParallelOptions, Placement};
use crate::rank::params;
use crate::rank::pipeline::{forward_only, run_schedule, RankLayout, StepInputs};
use crate::rank::{RankContext, RankModel};
use anyhow::{anyhow, bail, Result};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::borrow::Cow;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use titan_data::{tokenize_corpus_with, Batch, DataLoader, LoaderConfig, Tokenizer, ValidationBatches};
use titan_models::{Checkpointing, DocumentMask, Documents, ModelArgs, Transformer};
use titan_parallel::registry::with_group;
use titan_parallel::{CommExt, ReduceOp};

pub struct Trainer {
    pub cfg: JobConfig,
    pub rank: RankContext,
    pub args: ModelArgs,
    pub device: Device,
    /// This rank's pipeline stages (the whole model without pipeline parallelism).
    pub model: RankModel,
    pub layout: RankLayout,
    pub optim: Optimizers,
    pub schedule: LrSchedule,
    pub loader: DataLoader,
    pub tokenizer: Tokenizer,
    /// Steps completed.
    pub step: u64,
    /// How the parallelisms split this rank's parameters.
    pub placement: Placement,
    /// The blocks that recompute their activations in backward (`activation_checkpoint`).
    pub checkpointing: Checkpointing,
    /// Block-causal attention over packed documents (`model.attn_mask_type`).
    pub documents: Option<DocumentMask>,
    val_batches: Vec<Batch>,
    /// The sources of a dataset mixture (empty for one corpus), for per-source token metrics.
    source_names: Vec<String>,
    /// The checkpoint folder and the save in flight.
    pub checkpointer: Checkpointer,
    /// float16's dynamic loss scale (inactive otherwise).
    pub scaler: LossScaler,
    /// Loss-spike detection and the data windows rollbacks skipped (checkpointed).
    pub spikes: LossSpikes,
    /// Non-finite steps in a row, and in all (skipped under `fault.skip_nonfinite_steps` or by
    /// the loss scaler).
    bad_steps: u32,
    skipped_steps: u64,
}

/// The model a config describes, lazily initialised from `seed` on `device`.
pub fn build_model(cfg: &JobConfig, args: &ModelArgs, seed: u64, device: &Device) -> Transformer {
    Transformer::new(args, seed, device)
        .with_fused_attention(cfg.model.attention.is_fused())
        .with_fused_kernels(cfg.model.kernels.is_fused())
}

/// This rank's pipeline stages as the config describes them (kernels, compute type), lazily
/// initialised from `seed`, before any parallelism is applied.
pub(crate) fn build_stages(
    cfg: &JobConfig,
    args: &ModelArgs,
    layout: &RankLayout,
    seed: u64,
    device: &Device,
) -> Result<RankModel> {
    let fused = (cfg.model.attention.is_fused(), cfg.model.kernels.is_fused());
    let compute = compute_dtype(cfg.training.mixed_precision_param, device, cfg.training.device)?;
    let stages = layout.build(args, seed, fused, device);
    Ok(RankModel { chunks: stages.chunks.into_iter().map(|c| c.with_compute_dtype(compute)).collect() })
}

/// Applies the config's parallelisms to this rank's stages.
fn parallelize(cfg: &JobConfig, stages: RankModel, rank: &RankContext) -> (RankModel, Placement) {
    let p = &cfg.parallelism;
    let opts = ParallelOptions {
        sequence_parallel: p.enable_sequence_parallel,
        cp_rotate: p.context_parallel_rotate_method.rotate(),
        reshard_after_forward: p.fsdp_reshard_after_forward.reshards(p.pipeline_parallel_degree > 1),
        ddp_overlap: p.overlap_collectives,
    };
    let (model, mut placement) = parallelize_llama(stages, rank, opts);
    placement.fused_loss = cfg.model.kernels.is_fused();
    placement.bucket_bytes = p.ddp_bucket_cap_mb.max(1) << 20;
    (model, placement)
}

/// The compute type of `training.mixed_precision_param` (`None` = float32, the parameters'
/// type), if `device` supports it.
fn compute_dtype(precision: Precision, device: &Device, kind: DeviceKind) -> Result<Option<burn::tensor::DType>> {
    if !precision.is_half() {
        return Ok(None);
    }
    let dtype = precision.dtype();
    if !device.supports_dtype(dtype) {
        bail!(
            "`training.mixed_precision_param` = \"{precision}\": the {kind} device does not compute in {precision}; use {} or \"float32\"",
            if precision == Precision::BFloat16 { "\"float16\"" } else { "\"bfloat16\"" }
        );
    }
    Ok(Some(dtype))
}

impl Trainer {
    /// Builds the model, data and optimizer; resumes from the latest checkpoint when
    /// checkpointing is on and one exists.
    pub fn new(cfg: JobConfig, rank: RankContext) -> Result<Self> {
        let args = cfg.model_args().map_err(|e| anyhow!(e))?;
        let local_rank = titan_parallel::launcher::local_rank(rank.world_rank);
        let mut device =
            crate::device::select(cfg.training.device, cfg.training.device_index(), local_rank)?.autodiff();
        titan_kernels::choice::set_measure_on_gpu(cfg.model.attention == AttentionChoice::Auto);
        if cfg.activation_checkpoint.policy() == Ok(Checkpointing::Ops) {
            // Op-level selective AC: Burn's balanced strategy recomputes the memory-bound ops.
            device = device.gradient_checkpointing();
        }
        let tokenizer = Tokenizer::from_file(&cfg.model.tokenizer_file())?;
        if tokenizer.vocab_size() > args.vocab_size {
            bail!(
                "the tokenizer {} has {} tokens but model flavor {:?} has vocab_size {}; use a smaller tokenizer or a larger flavor",
                tokenizer.path().display(), tokenizer.vocab_size(), cfg.model.flavor, args.vocab_size
            );
        }
        let cache = paths::resolve(&cfg.training.cache_dir);
        let corpus = cfg.training.corpus_options();
        // One corpus, or the sources of a mixture with their weights.
        let specs: Vec<(std::path::PathBuf, f64)> = if cfg.training.datasets.is_empty() {
            vec![(paths::dataset(&cfg.training.dataset, &cfg.training.dataset_path), 1.0)]
        } else {
            cfg.training.datasets.iter().map(|d| (paths::resolve(&d.path), d.weight)).collect()
        };
        let mut corpora = Vec::new();
        for (path, weight) in &specs {
            corpora.push((Arc::new(tokenize_corpus_with(path, &tokenizer, &cache, &corpus)?), *weight));
        }
        let source_names: Vec<String> =
            if specs.len() > 1 { cfg.training.datasets.iter().map(|d| d.path.clone()).collect() } else { Vec::new() };
        let seq_len = cfg.training.seq_len;
        let loader = DataLoader::mixture(
            corpora,
            LoaderConfig {
                seq_len,
                global_batch_size: cfg.global_batch_size(rank.dp_degree),
                local_batch_size: cfg.training.local_batch_size,
                dp_rank: rank.dp_rank,
                dp_degree: rank.dp_degree,
                seed: cfg.training.seed,
            },
        )?;
        let val_batches = if cfg.validation.enable {
            let v = &cfg.validation;
            let path = paths::dataset(&v.dataset, &v.dataset_path);
            let vt = tokenize_corpus_with(&path, &tokenizer, &cache, &corpus)?;
            let b = ValidationBatches::collect(&vt, seq_len, v.local_batch_size, v.steps());
            if b.is_empty() {
                bail!(
                    "validation set {} is too small for one batch of {} × {seq_len} tokens",
                    path.display(),
                    v.local_batch_size
                );
            }
            b
        } else {
            Vec::new()
        };
        let layout = RankLayout::new(&cfg.parallelism, &args, cfg.training.local_batch_size, rank.pp_rank)
            .map_err(|e| anyhow!(e))?;
        let stages = build_stages(&cfg, &args, &layout, cfg.training.seed, &device)?;
        let (model, placement) = parallelize(&cfg, stages, &rank);
        if placement.fsdp.is_some() && cfg.parallelism.overlap_collectives {
            let groups: Vec<_> = [&rank.fsdp, &rank.efsdp].into_iter().flatten().collect();
            // HSDP's replica all-reduce joins the stream too (not under PP: its schedule
            // interleaves the microbatches' passes).
            let replicas = match (&rank.replicate, &rank.pp) {
                (Some(r), None) => Some((r.as_ref(), placement.bucket_bytes)),
                _ => None,
            };
            titan_parallel::fsdp::overlap::enable(&groups, cfg.parallelism.fsdp_prefetch_depth, replicas)?;
        }
        if let (Some(_), Some(replicate)) = (&placement.ddp_hooks, &rank.replicate) {
            titan_parallel::ddp::overlap::enable(replicate.as_ref(), placement.bucket_bytes)?;
        }
        let mut t = Self {
            optim: {
                let mut o = Optimizers::new(&cfg.optimizer, cfg.model.kernels.is_fused())?;
                o.prepare(&model, |local| layout.global_key(local))?;
                o
            },
            schedule: LrSchedule::new(&cfg.lr_scheduler, cfg.optimizer.lr, cfg.training.steps),
            args,
            device,
            model,
            layout,
            loader,
            documents: (cfg.model.attn_mask_type == MaskType::BlockCausal).then(|| DocumentMask {
                eos: tokenizer.eos_id() as i64,
                restart_positions: cfg.model.rope_per_document,
            }),
            tokenizer,
            step: 0,
            placement,
            checkpointing: cfg.activation_checkpoint.policy().map_err(|e| anyhow!(e))?,
            val_batches,
            checkpointer: Checkpointer::new(&cfg),
            scaler: LossScaler::new(
                cfg.training.mixed_precision_param == Precision::Float16
                    && cfg.training.loss_scale == LossScaleMode::Dynamic,
                cfg.training.loss_scale_init,
                cfg.training.loss_scale_growth_interval,
            ),
            spikes: LossSpikes::default(),
            source_names,
            bad_steps: 0,
            skipped_steps: 0,
            cfg,
            rank,
        };
        let (checkpointer, mut state) = t.checkpoint_parts();
        if state.cfg.checkpoint.enable {
            checkpointer.resume(&mut state)?;
        } else if !state.cfg.checkpoint.initial_load_path.is_empty() {
            crate::checkpoint::initial_load(&mut state)?;
        }
        Ok(t)
    }

    /// The checkpointer and the state it saves or fills, borrowed apart.
    fn checkpoint_parts(&mut self) -> (&mut Checkpointer, TrainingState<'_>) {
        let Trainer {
            cfg,
            args,
            model,
            optim,
            loader,
            step,
            placement,
            layout,
            rank,
            device,
            checkpointer,
            scaler,
            spikes,
            ..
        } = self;
        let state =
            TrainingState { cfg, args, model, optim, loader, step, placement, layout, rank, device, scaler, spikes };
        (checkpointer, state)
    }

    /// Checkpoints the state after the current step (every rank calls it); see
    /// [`Checkpointer::save`].
    pub fn save_checkpoint(&mut self) -> Result<Option<PathBuf>> {
        let (checkpointer, state) = self.checkpoint_parts();
        checkpointer.save(&state)
    }

    /// Loss-spike rollback: back to the last checkpoint before step `first` (model, optimizer,
    /// step counter, loss scale, spike history), the data position kept where it is, so the
    /// samples read since that checkpoint are skipped; the window is recorded. Checkpoints after
    /// the one rolled back to hold the spike and are discarded.
    pub fn roll_back(&mut self, spike_step: u64, first: u64) -> Result<SkippedWindow> {
        self.wait_for_pending_save()?;
        let position = self.loader.state();
        let discard = self.rank.world_rank == 0;
        let (checkpointer, mut state) = self.checkpoint_parts();
        let target = checkpointer.roll_back(&mut state, first, discard)?;
        let window = SkippedWindow {
            spike_step,
            resumed_from_step: target,
            first_sample: self.loader.state().samples_consumed,
            end_sample: position.samples_consumed,
        };
        self.loader.load_state(position);
        self.spikes.skipped.push(window.clone());
        Ok(window)
    }

    /// Commits the background save if every rank's writer has finished (a collective).
    pub fn poll_pending_save(&mut self) -> Result<Option<PathBuf>> {
        self.checkpointer.poll(&self.rank)
    }

    /// Waits for the background save and commits it (every rank calls it).
    pub fn wait_for_pending_save(&mut self) -> Result<Option<PathBuf>> {
        self.checkpointer.wait(&self.rank)
    }

    /// Writes the latest checkpoint's model as a Hugging Face folder (`checkpoint.last_save_in_hf`).
    pub fn export_hf(&mut self) -> Result<Option<PathBuf>> {
        self.checkpointer.export_hf(&self.cfg, &self.args, &self.rank)
    }

    /// Tokens in one global batch (all data-parallel ranks).
    pub fn tokens_per_step(&self) -> usize {
        self.cfg.global_batch_size(self.rank.dp_degree) * self.cfg.training.seq_len
    }

    /// One optimizer step over the next global batch (accumulating microbatches).
    pub fn train_step(&mut self) -> Result<StepStats> {
        let start = Instant::now();
        titan_parallel::comm::timing::take_seconds();
        titan_parallel::ep::take_all_to_all_seconds();
        let step = self.step + 1;
        let lr = self.schedule.lr(step);
        let first_sample = self.loader.state().samples_consumed;
        let mut microbatches = {
            let _span = titan_profiling::span("data", "data");
            self.loader.next_step()
        };
        self.inject_spike(first_sample, &mut microbatches);
        let local: Vec<(Cow<Batch>, Option<Documents>)> = microbatches.iter().map(|b| self.local_batch(b)).collect();
        let local_tokens: usize = local.iter().map(|(b, _)| b.num_tokens()).sum();
        // Every rank's batch has the same shape, so the global token count is known up front.
        let total_tokens = local_tokens * self.rank.dp_degree * self.rank.cp_degree();
        titan_models::moe::set_objective_tokens(total_tokens);
        let inject = self.cfg.debug.nonfinite_at() == Some(step);
        let (mut loss_sum, mut busy) = (0.0f64, 0.0f64);
        let mut acc = GradientsParams::new();
        let pipeline_start = Instant::now();
        let comm_before = titan_parallel::comm::timing::seconds();
        if let Some(sharding) = &self.placement.fsdp {
            let replica_only = |id| !self.placement.partial_over_tp(id);
            titan_parallel::fsdp::overlap::begin_step(&self.model, sharding, titan_profiling::is_active(), &replica_only);
        }
        for (i, (batch, docs)) in local.iter().enumerate() {
            if i + 1 == local.len() {
                titan_parallel::fsdp::overlap::begin_last_pass();
            }
            if let (Some(keys), true) = (&self.placement.ddp_hooks, i + 1 == local.len()) {
                titan_parallel::ddp::overlap::begin_last_pass(&self.model, keys, &acc, titan_profiling::is_active());
            }
            let io = StepInputs {
                batch,
                total_tokens,
                loss_scale: self.scaler.scale(),
                inject_nan: inject,
                hidden_positions: self.hidden_positions(),
                dim: self.args.dim,
                checkpointing: self.checkpointing,
                documents: docs.as_ref(),
            };
            let pp = self.rank.pp.as_deref();
            let out = run_schedule(&self.model, &self.layout, &self.placement, pp, &io, &self.device, &mut acc)?;
            loss_sum += out.loss;
            busy += out.busy.as_secs_f64();
        }
        // FSDP's queued reduce-scatters join the gradients and DDP's overlapped all-reduce
        // ends (overlap on; nothing otherwise).
        let mut all_reduced = HashSet::new();
        let mut stream =
            titan_parallel::fsdp::overlap::end_step(&self.model, &mut acc, &mut all_reduced)?.unwrap_or_default();
        if let Some(keys) = &self.placement.ddp_hooks {
            if let Some((done, s)) = titan_parallel::ddp::overlap::finish(&self.model, keys, &mut acc)? {
                all_reduced.extend(done);
                stream.absorb(s);
            }
        }
        for e in &stream.events {
            titan_profiling::add_event(titan_profiling::Event {
                name: e.name.clone(),
                cat: "comm",
                ts_us: e.ts_us,
                dur_us: e.dur_us,
                args: vec![("bytes", e.bytes.into())],
                lane: titan_profiling::COMM_LANE,
            });
        }
        let slowness = self.inject_slowness();
        busy += slowness;
        let in_collectives = titan_parallel::comm::timing::seconds() - comm_before;
        let compute_seconds = (pipeline_start.elapsed().as_secs_f64() - in_collectives).max(0.0);
        let sdc_suspects = match self.sdc_due(step) {
            true => Some(self.sdc_verdict(step, &microbatches[0])?),
            false => None,
        };
        let pipeline_seconds = pipeline_start.elapsed().as_secs_f64();
        self.inject_failure(step)?;
        {
            let _span = titan_profiling::span("gradient reduction", "comm");
            self.placement.reduce_gradients(&self.model, &mut acc, &self.rank, &all_reduced)?;
        }
        // The loss lives on the last pipeline stage of every data-parallel rank, in parts over
        // the context-parallel ranks.
        loss_sum = self.sum_over_cp(loss_sum)?;
        for group in [&self.rank.dp, &self.rank.pp].into_iter().flatten() {
            let mut l = [loss_sum as f32];
            group.all_reduce(&mut l, ReduceOp::Sum)?;
            loss_sum = l[0] as f64;
        }
        // Under float16 loss scaling the gradients are S times the true ones: the norm is
        // divided by S, and so are the gradients, inside the update.
        let loss_scale = self.scaler.scale();
        let grad_norm = {
            let _span = titan_profiling::span("grad norm", "optimizer");
            self.placement.grad_norm(&self.model, &acc, &self.rank)? / loss_scale
        };
        let finite = loss_sum.is_finite() && grad_norm.is_finite();
        let verdict = self.scaler.update(finite);
        let skipped = !finite;
        if finite {
            self.bad_steps = 0;
        } else {
            self.bad_steps += 1;
            self.skipped_steps += 1;
            let allowed = self.cfg.fault.skip_nonfinite_steps;
            if verdict == Verdict::Skip {
                if self.bad_steps > MAX_CONSECUTIVE_SKIPS {
                    bail!(
                        "step {step}: {} overflowing steps in a row (the loss is {loss_sum}, the loss scale now {:e}): the loss itself is not finite in float16; try `training.mixed_precision_param = \"float32\"` or a lower `optimizer.lr`",
                        self.bad_steps,
                        self.scaler.scale()
                    );
                }
                tracing::warn!(
                    "step {step}: gradients overflowed in float16 at loss scale {loss_scale:e}; step skipped (batch dropped, parameters and optimizer state unchanged), loss scale now {:e}",
                    self.scaler.scale()
                );
            } else if self.bad_steps <= allowed {
                tracing::warn!(
                    "step {step}: the loss is {loss_sum} and the gradient norm {grad_norm}; update skipped (batch dropped, parameters and optimizer state unchanged; {} of {allowed} allowed in a row by `fault.skip_nonfinite_steps`, {} skipped so far)",
                    self.bad_steps,
                    self.skipped_steps
                );
            } else {
                let last = self.checkpointer.folder().latest().ok().flatten();
                bail!(
                    "step {step}: the loss is {loss_sum} and the gradient norm {grad_norm}; training stopped and this state was not checkpointed{}. Try a lower `optimizer.lr` (now {}) or a smaller `training.max_norm`, or skip such steps with `fault.skip_nonfinite_steps` (now {allowed}).",
                    last.map(|s| format!(" (the last good checkpoint is step-{s})")).unwrap_or_default(),
                    self.cfg.optimizer.lr
                );
            }
        }
        let mut expert_load = Vec::new();
        if !skipped {
            let scale = grads::clip_coefficient(grad_norm, self.cfg.training.max_norm) / loss_scale;
            let model = std::mem::replace(&mut self.model, RankModel { chunks: Vec::new() });
            let model = {
                let _span = titan_profiling::span("optimizer", "optimizer");
                self.optim.step(model, acc, lr, scale, &self.placement, &self.device)?
            };
            let (model, load) = crate::optim::expert_bias::balance(model, &self.rank, &self.device)?;
            (self.model, expert_load) = (model, load);
        }
        self.step = step;
        Ok(StepStats {
            step,
            loss: loss_sum,
            grad_norm,
            lr,
            tokens: local_tokens,
            seconds: start.elapsed().as_secs_f64(),
            comm_seconds: titan_parallel::comm::timing::take_seconds(),
            comm_hidden_seconds: stream.hidden_seconds(),
            busy_seconds: busy,
            compute_seconds,
            pipeline_seconds,
            param_bytes: params::param_bytes(&self.model),
            optim_bytes: self.optim.state_bytes(),
            tokens_by_source: self.tokens_by_source(),
            expert_load,
            all_to_all_seconds: titan_parallel::ep::take_all_to_all_seconds(),
            skipped,
            loss_scale: self.scaler.enabled().then_some(loss_scale),
            sdc_suspects,
            stragglers: Vec::new(),
        })
    }

    /// The SDC check of `step` ([`super::sdc`]) and what `fault.sdc_action` does with a finding.
    fn sdc_verdict(&self, step: u64, shape: &Batch) -> Result<Vec<crate::metrics::Suspect>> {
        let _span = titan_profiling::span("sdc check", "fault");
        let suspects = self.sdc_check(step, shape)?;
        if suspects.is_empty() {
            return Ok(suspects);
        }
        let found = suspects.iter().map(|s| s.to_string()).collect::<Vec<_>>().join("; ");
        match self.cfg.fault.sdc_action {
            SdcAction::Stop => bail!(
                "silent-data-corruption check at step {step}: {found}. Training stopped (`fault.sdc_action` = \"stop\"); take the named host out of the job and resume from the last checkpoint, or set `fault.sdc_action` = \"warn\" to keep going"
            ),
            SdcAction::Warn => tracing::warn!("silent-data-corruption check at step {step}: {found}"),
        }
        Ok(suspects)
    }

    /// `debug.spike_at_steps`: scrambles the targets of the batch starting at global sample
    /// `first_sample` if an uninterrupted run reads it at a listed step.
    fn inject_spike(&self, first_sample: u64, batches: &mut [Batch]) {
        let per_step = self.cfg.global_batch_size(self.rank.dp_degree) as u64;
        if !self.cfg.debug.spike_at_steps.contains(&(first_sample / per_step.max(1) + 1)) {
            return;
        }
        let vocab = self.args.vocab_size as i64;
        for b in batches {
            for (t, i) in b.targets.iter_mut().zip(&b.inputs) {
                *t = (i * 7919 + 13) % vocab;
            }
        }
    }

    /// `debug.slow_rank`: that rank computes `debug.slow_seconds` longer each step (a sleep,
    /// counted as compute); returns the seconds slept.
    fn inject_slowness(&self) -> f64 {
        let d = &self.cfg.debug;
        if d.slow_rank != self.rank.world_rank as i64 || d.slow_seconds <= 0.0 {
            return 0.0;
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(d.slow_seconds));
        d.slow_seconds
    }

    /// `debug.fail_at_steps`: this attempt's injected failure, if it is due at `step` on this
    /// rank — the process killed, or an error returned (the other ranks are then waiting in the
    /// gradient reduction).
    fn inject_failure(&self, step: u64) -> Result<()> {
        let d = &self.cfg.debug;
        let world = self.rank.world.as_ref().map_or(1, |w| w.size());
        let rank = d.fail_rank(world);
        if d.fail_at() != Some(step) || rank != self.rank.world_rank {
            return Ok(());
        }
        match d.fail_mode {
            FailMode::Kill => {
                eprintln!("rank {rank}: debug.fail_at_steps: killing this process at step {step}");
                // SAFETY: signals this process; nothing after it runs.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            FailMode::Hang => {
                eprintln!("rank {rank}: debug.fail_at_steps: hanging at step {step}");
                // The other ranks time out waiting for this one, write the hang report and end
                // the job (this thread or process with it).
                loop {
                    std::thread::sleep(std::time::Duration::from_secs(3600));
                }
            }
            FailMode::Error => {}
        }
        bail!("injected failure at step {step} (debug.fail_at_steps, attempt {})", d.restart_attempt)
    }

    /// Tokens of the whole job seen from each mixture source (a pure function of the samples
    /// consumed, so it survives resume and resharding).
    fn tokens_by_source(&mut self) -> Vec<(String, u64)> {
        if self.source_names.is_empty() {
            return Vec::new();
        }
        let seen = self.loader.state().samples_consumed;
        let counts = self.loader.source_samples(seen);
        let seq = self.cfg.training.seq_len as u64;
        self.source_names.iter().cloned().zip(counts.into_iter().map(|n| n * seq)).collect()
    }

    /// This rank's part of `batch` with its documents: the whole batch, or under context
    /// parallelism its columns of every row (documents found on the whole rows first, so
    /// starts and positions stay global).
    pub(super) fn local_batch<'b>(&self, batch: &'b Batch) -> (Cow<'b, Batch>, Option<Documents>) {
        let docs = match (self.documents, &self.placement.cp) {
            (Some(mask), _) => Some(mask.documents(&batch.inputs, batch.batch, batch.seq_len)),
            (None, Some(_)) => Some(Documents::causal(batch.batch, (0..batch.seq_len).collect())),
            (None, None) => None,
        };
        let Some(cp) = &self.placement.cp else { return (Cow::Borrowed(batch), docs) };
        let t = batch.seq_len;
        let cols = cp.columns(t);
        let local = Batch {
            inputs: cp.shard(&batch.inputs, t),
            targets: cp.shard(&batch.targets, t),
            batch: batch.batch,
            seq_len: cols.len(),
        };
        (Cow::Owned(local), docs.map(|d| d.select(&cols)))
    }

    /// `x` summed over the context-parallel group (itself without one).
    fn sum_over_cp(&self, x: f64) -> Result<f64> {
        let Some(g) = &self.rank.cp else { return Ok(x) };
        let mut v = [x as f32];
        with_group(g.id(), |c| c.all_reduce(&mut v, ReduceOp::Sum))?;
        Ok(v[0] as f64)
    }

    /// Positions per rank in the hidden states between pipeline stages.
    pub(super) fn hidden_positions(&self) -> usize {
        let seq = self.cfg.training.seq_len / self.rank.cp_degree();
        match &self.rank.tp {
            Some(g) if self.placement.sequence_parallel() => seq / g.size(),
            _ => seq,
        }
    }

    pub fn validation_enabled(&self) -> bool {
        !self.val_batches.is_empty()
    }

    /// Mean loss per token over the validation batches, and the token count.
    pub fn validate(&self) -> Result<(f64, usize)> {
        let model = self.model.valid();
        let device = self.device.clone().without_autodiff();
        let (mut sum, mut n) = (0.0f64, 0usize);
        let pp = self.rank.pp.as_deref();
        for b in &self.val_batches {
            let (h, dim) = (self.hidden_positions(), self.args.dim);
            let (local, docs) = self.local_batch(b);
            sum += forward_only(&model, &self.layout, &self.placement, pp, &local, docs.as_ref(), h, dim, &device)?;
            n += b.num_tokens();
        }
        sum = self.sum_over_cp(sum)?;
        if let Some(pp) = pp {
            let mut s = [sum as f32];
            pp.all_reduce(&mut s, ReduceOp::Sum)?;
            sum = s[0] as f64;
        }
        Ok((sum / n as f64, n))
    }
}
