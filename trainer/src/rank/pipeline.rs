//! The stages this rank holds and the execution of a pipeline schedule over them.
//!
//! Every layout runs through here: without pipeline parallelism the rank holds one stage (the
//! whole model) and the schedule is one forward and one backward. With it, activations go to the
//! next stage and gradients to the previous one by send/recv; a stage's backward starts from the
//! gradient of its output (`(y · dy).sum().backward()`, the vector-Jacobian product), and the
//! parameter gradients of all microbatches are accumulated.

use crate::rank::grads;
use crate::rank::parallelize::Placement;
use crate::rank::{RankContext, RankModel};
use anyhow::{bail, Result};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use titan_checkpoints::{load_tensors, save_tensors, TensorMap};
use titan_data::Batch;
use titan_models::decoder::StageInput;
use titan_models::{Checkpointing, Documents, Tape};
use titan_models::{ModelArgs, Transformer};
use titan_parallel::pp::schedule::{check_microbatches, rank_actions};
use titan_parallel::pp::{Action, Schedule, StageSplit};
use titan_parallel::{CommExt, Communicator};

/// Token ids `v` as a `[b, t]` tensor.
pub fn to_tensor_2d(v: &[i64], b: usize, t: usize, device: &Device) -> Tensor<2, Int> {
    titan_kernels::transfer::to_device(TensorData::new(v.to_vec(), [b, t]), device)
}

/// Where this rank sits in the pipeline, and how it runs a step.
#[derive(Debug, Clone)]
pub struct RankLayout {
    pub split: StageSplit,
    pub schedule: Schedule,
    pub microbatches: usize,
    pub pp_rank: usize,
    /// The global stage of each local chunk.
    pub stages: Vec<usize>,
}

impl RankLayout {
    /// The layout the config gives for pipeline rank `pp_rank` of `pp`; errors name the key.
    pub fn new(
        p: &crate::config::Parallelism,
        args: &ModelArgs,
        local_batch: usize,
        pp_rank: usize,
    ) -> Result<Self, String> {
        let pp = p.pipeline_parallel_degree.max(1);
        let schedule = p.pipeline_parallel_schedule.schedule();
        let (schedule, microbatches) = if pp == 1 {
            (Schedule::GPipe, 1)
        } else {
            let n = p.pp_microbatches();
            check_microbatches(schedule, pp, n)?;
            if local_batch % n != 0 {
                return Err(format!(
                    "`training.local_batch_size` = {local_batch} does not split into `parallelism.num_pp_microbatches` = {n} microbatches; use a multiple of {n}"
                ));
            }
            (schedule, n)
        };
        let lps = p.layers_per_stage();
        let split = StageSplit::new(args.n_layers, pp, schedule, lps)?;
        let stages = split.stages_of_rank(pp_rank);
        Ok(Self { split, schedule, microbatches, pp_rank, stages })
    }

    fn last_stage(&self) -> usize {
        self.split.num_stages() - 1
    }

    /// This rank's stages of the model, lazily initialised exactly as the whole model would be.
    /// `fused = (attention, other kernels)`: whether to use the fused kernels where the device
    /// has them.
    pub fn build(&self, args: &ModelArgs, seed: u64, fused: (bool, bool), device: &Device) -> RankModel {
        let last = self.last_stage();
        let chunks = self
            .stages
            .iter()
            .map(|&s| {
                Transformer::stage(args, seed, device, self.split.layers[s].clone(), s == 0, s == last)
                    .with_fused_attention(fused.0)
                    .with_fused_kernels(fused.1)
            })
            .collect();
        RankModel { chunks }
    }

    /// The whole model's name of a local parameter key (`[exp_avg.]chunks.C.layers.I.…` →
    /// `[exp_avg.]layers.G.…`), as checkpoints store it.
    pub fn global_key(&self, local: &str) -> String {
        let (prefix, rest) = split_prefix(local);
        let mut parts = rest.splitn(3, '.');
        let (Some("chunks"), Some(c), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
            return local.to_string();
        };
        let stage = self.stages[c.parse::<usize>().expect("chunk index")];
        match layer_of(rest) {
            Some((i, tail)) => format!("{prefix}layers.{}.{tail}", self.split.layers[stage].start + i),
            None => format!("{prefix}{rest}"),
        }
    }

    /// The local key of a checkpoint key, or `None` when another pipeline rank holds it.
    pub fn local_key(&self, global: &str) -> Option<String> {
        let (prefix, rest) = split_prefix(global);
        let (chunk, rest) = match layer_of(rest) {
            Some((g, tail)) => {
                let c = self.stages.iter().position(|&s| self.split.layers[s].contains(&g))?;
                (c, format!("layers.{}.{tail}", g - self.split.layers[self.stages[c]].start))
            }
            None if rest.starts_with("tok_embeddings.") => {
                (self.stages.iter().position(|&s| s == 0)?, rest.to_string())
            }
            None if rest.starts_with("norm.") || rest.starts_with("output.") => {
                (self.stages.iter().position(|&s| s == self.last_stage())?, rest.to_string())
            }
            // Not a parameter of this model: keep it so the loader reports it.
            None => (0, rest.to_string()),
        };
        Some(format!("{prefix}chunks.{chunk}.{rest}"))
    }
}

use crate::optim::split_state_key as split_prefix;

/// `layers.I.tail` → `(I, tail)`.
fn layer_of(path: &str) -> Option<(usize, &str)> {
    let rest = path.strip_prefix("layers.")?;
    let (i, tail) = rest.split_once('.')?;
    Some((i.parse().ok()?, tail))
}

/// What a forward left for its backward.
enum Saved {
    /// Last stage: the input leaf (None when it is also stage 0) and the loss.
    Loss(Option<Tensor<3>>, Tensor<1>, Tape),
    /// Other stages: the input leaf (None on stage 0) and the output.
    Output(Option<Tensor<3>>, Tensor<3>, Tape),
}

/// One step's data and settings for the pipeline.
pub struct StepInputs<'a> {
    pub batch: &'a Batch,
    /// The global number of target tokens of the step (the loss is divided by it).
    pub total_tokens: usize,
    /// The factor the loss is multiplied by for backward (float16's loss scale; 1 otherwise).
    pub loss_scale: f64,
    pub inject_nan: bool,
    /// Positions per rank in the hidden states between stages (`seq_len / tp` under SP).
    pub hidden_positions: usize,
    pub dim: usize,
    /// The blocks that recompute their activations in backward.
    pub checkpointing: Checkpointing,
    /// The documents of the batch's rows (block-causal attention), and under context
    /// parallelism the global positions of this rank's columns; `None`: causal over `0..T`.
    pub documents: Option<&'a Documents>,
}

/// What running the schedule on one batch produced on this rank.
pub struct StepOutputs {
    /// The loss of the batch (summed over its microbatches); 0 on ranks without the last stage.
    pub loss: f64,
    /// Time spent computing (forward and backward, not waiting for other stages).
    pub busy: Duration,
}

fn tag(stage: usize, microbatch: usize, stages: usize, backward: bool) -> u32 {
    ((microbatch * stages + stage) * 2 + usize::from(backward)) as u32
}

/// Moves `[b, positions, dim]` hidden states (activations forward, their gradients backward)
/// between the ranks of the pipeline group, tagged by the stage they are for and the microbatch.
struct Wire<'a> {
    pp: Option<&'a dyn Communicator>,
    layout: &'a RankLayout,
    hidden: [usize; 3],
    device: &'a Device,
}

impl Wire<'_> {
    fn comm(&self) -> &dyn Communicator {
        self.pp.expect("a pipeline of several ranks has a pp group")
    }

    fn tag(&self, stage: usize, microbatch: usize, backward: bool) -> u32 {
        tag(stage, microbatch, self.layout.split.num_stages(), backward)
    }

    /// What `from`'s rank sent for `stage` (its activations, or with `backward` the gradient of
    /// `stage`'s output).
    fn recv(&self, stage: usize, microbatch: usize, from: usize, backward: bool) -> Result<Tensor<3>> {
        let mut buf = vec![0f32; self.hidden.iter().product()];
        let peer = self.layout.split.rank_of_stage(from);
        let _span =
            titan_profiling::span_with(|| format!("pp.recv {} mb {microbatch}", direction(backward)), "pipeline")
                .arg("bytes", buf.len() * 4)
                .arg("peer", peer)
                .arg("stage", stage);
        self.comm().recv(&mut buf, peer, self.tag(stage, microbatch, backward))?;
        Ok(titan_kernels::transfer::to_device(TensorData::new(buf, self.hidden), self.device))
    }

    /// Sends `x` to the rank of `stage` (activations for its input, or with `backward` the
    /// gradient of its output).
    fn send(&self, x: Tensor<3>, stage: usize, microbatch: usize, backward: bool) -> Result<()> {
        let data = titan_kernels::transfer::to_host_f32(x);
        let peer = self.layout.split.rank_of_stage(stage);
        let _span =
            titan_profiling::span_with(|| format!("pp.send {} mb {microbatch}", direction(backward)), "pipeline")
                .arg("bytes", data.len() * 4)
                .arg("peer", peer)
                .arg("stage", stage);
        self.comm().send(&data, peer, self.tag(stage, microbatch, backward))?;
        Ok(())
    }
}

/// What a pipeline message carries, for trace span names.
fn direction(backward: bool) -> &'static str {
    if backward {
        "gradient"
    } else {
        "activation"
    }
}

/// Runs this rank's schedule for one batch (split into the layout's microbatches), adding the
/// parameter gradients to `acc`.
pub fn run_schedule(
    model: &RankModel,
    layout: &RankLayout,
    placement: &Placement,
    pp: Option<&dyn Communicator>,
    io: &StepInputs,
    device: &Device,
    acc: &mut GradientsParams,
) -> Result<StepOutputs> {
    let (b, t) = (io.batch.batch / layout.microbatches, io.batch.seq_len);
    let stages = layout.split.num_stages();
    let rows = |v: &[i64], m: usize| to_tensor_2d(&v[m * b * t..(m + 1) * b * t], b, t, device);
    let docs = |m: usize| io.documents.map(|d| d.rows(m * b, b));
    let wire = Wire { pp, layout, hidden: [b, io.hidden_positions, io.dim], device };
    let mut saved: HashMap<(usize, usize), Saved> = HashMap::new();
    let (mut loss_sum, mut busy) = (0.0f64, Duration::ZERO);
    for action in
        rank_actions(layout.schedule, layout.split.pp, layout.split.virtual_stages, layout.microbatches, layout.pp_rank)
    {
        let mut waited = Duration::ZERO;
        let start = Instant::now();
        let mut recv = |stage: usize, m: usize, from: usize, backward: bool| -> Result<Tensor<3>> {
            let w = Instant::now();
            let x = wire.recv(stage, m, from, backward);
            waited += w.elapsed();
            x
        };
        match action {
            Action::Forward { stage, microbatch: m } => {
                let _span = titan_profiling::span_with(|| format!("forward stage {stage} mb {m}"), "forward");
                let chunk = &model.chunks[stage / layout.split.pp];
                let (input, x) = if stage == 0 {
                    (StageInput::Tokens(rows(&io.batch.inputs, m)), None)
                } else {
                    let x = recv(stage, m, stage - 1, false)?.require_grad();
                    (StageInput::Hidden(x.clone()), Some(x))
                };
                let (y, tape) = chunk.forward_stage_checkpointed(input, t, docs(m).as_ref(), io.checkpointing);
                if stage == stages - 1 {
                    let mut loss = placement.loss(y, rows(&io.batch.targets, m)).div_scalar(io.total_tokens as f64);
                    if io.inject_nan {
                        loss = loss.mul_scalar(f64::NAN);
                    }
                    loss_sum += titan_kernels::transfer::scalar(loss.clone()) as f64;
                    if io.loss_scale != 1.0 {
                        loss = loss.mul_scalar(io.loss_scale);
                    }
                    saved.insert((stage, m), Saved::Loss(x, loss, tape));
                } else {
                    wire.send(y.clone(), stage + 1, m, false)?;
                    saved.insert((stage, m), Saved::Output(x, y, tape));
                }
            }
            Action::Backward { stage, microbatch: m } => {
                let _span = titan_profiling::span_with(|| format!("backward stage {stage} mb {m}"), "backward");
                // DDP's and HSDP's overlap counted the parameter reads of the last forward; not a
                // recompute's.
                titan_parallel::ddp::overlap::end_forward();
                titan_parallel::fsdp::overlap::end_forward();
                let Some(s) = saved.remove(&(stage, m)) else { bail!("schedule runs backward before forward") };
                let (x, root, tape) = match s {
                    Saved::Loss(x, loss, tape) => (x, loss, tape),
                    Saved::Output(x, y, tape) => {
                        // Under mixed precision the stage output is half precision.
                        let dy = recv(stage, m, stage + 1, true)?.cast(y.dtype());
                        (x, (y * dy).sum(), tape)
                    }
                };
                let chunk = &model.chunks[stage / layout.split.pp];
                // Each backward pass's gradients join the accumulator as a whole; the overlapped
                // collectives (FSDP's reduce-scatters, DDP's all-reduce) are told where one ends.
                let grads = chunk.backward_stage(root, tape, |g| {
                    titan_parallel::seal_backward_pass();
                    grads::accumulate(model, acc, GradientsParams::from_grads(g, model))
                });
                if let Some(x) = x {
                    wire.send(x.grad(&grads).expect("the stage input takes part in the loss"), stage - 1, m, true)?;
                }
                titan_parallel::seal_backward_pass();
                grads::accumulate(model, acc, GradientsParams::from_grads(grads, model));
            }
        }
        busy += start.elapsed().saturating_sub(waited);
    }
    Ok(StepOutputs { loss: loss_sum, busy })
}

/// The summed loss of `batch` through this rank's stages in order, without gradients (0 on
/// ranks without the last stage).
#[allow(clippy::too_many_arguments)]
pub fn forward_only(
    model: &RankModel,
    layout: &RankLayout,
    placement: &Placement,
    pp: Option<&dyn Communicator>,
    batch: &Batch,
    docs: Option<&Documents>,
    hidden_positions: usize,
    dim: usize,
    device: &Device,
) -> Result<f64> {
    let (b, t) = (batch.batch, batch.seq_len);
    let stages = layout.split.num_stages();
    let wire = Wire { pp, layout, hidden: [b, hidden_positions, dim], device };
    let mut loss = 0.0;
    for (c, &stage) in layout.stages.iter().enumerate() {
        let input = if stage == 0 {
            StageInput::Tokens(to_tensor_2d(&batch.inputs, b, t, device))
        } else {
            StageInput::Hidden(wire.recv(stage, 0, stage - 1, false)?)
        };
        let y = model.chunks[c].forward_stage(input, t, docs);
        if stage == stages - 1 {
            loss =
                titan_kernels::transfer::scalar(placement.loss(y, to_tensor_2d(&batch.targets, b, t, device))) as f64;
        } else {
            wire.send(y, stage + 1, 0, false)?;
        }
    }
    Ok(loss)
}

/// Tags for moving checkpoint tensors between pipeline stages (below any schedule tag's range
/// would be ambiguous, so far above it; MPI guarantees tags up to 32767).
const CKPT_LEN_TAG: u32 = 32_000;
const CKPT_DATA_TAG: u32 = 32_001;

/// Renames this rank's full (gathered) stage tensors to the whole model's names and collects
/// every stage's on world rank 0, which returns them all; `None` on every other rank. Only the
/// ranks holding full stage tensors (data-parallel rank 0, tensor-parallel rank 0) take part.
pub fn gather_stages(map: TensorMap, layout: &RankLayout, rank: &RankContext) -> Result<Option<TensorMap>> {
    let tp_rank = rank.tp.as_ref().map_or(0, |g| g.rank());
    if rank.dp_rank != 0 || tp_rank != 0 {
        return Ok(None);
    }
    let mut map: TensorMap = map.into_iter().map(|(k, t)| (layout.global_key(&k), t)).collect();
    let Some(pp) = &rank.pp else { return Ok(Some(map)) };
    if layout.pp_rank != 0 {
        let bytes = save_tensors(&map, HashMap::new())?;
        pp.send(&(bytes.len() as u64).to_le_bytes(), 0, CKPT_LEN_TAG)?;
        pp.send(&bytes, 0, CKPT_DATA_TAG)?;
        return Ok(None);
    }
    for stage_rank in 1..pp.size() {
        let mut len = [0u8; 8];
        pp.recv(&mut len, stage_rank, CKPT_LEN_TAG)?;
        let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
        pp.recv(&mut bytes, stage_rank, CKPT_DATA_TAG)?;
        let (part, _) = load_tensors(std::path::Path::new("pipeline stage tensors"), &bytes)?;
        map.extend(part);
    }
    Ok(Some(map))
}
