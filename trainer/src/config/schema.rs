//! The job configuration: TorchTitan's TOML-era sections and keys, each with a default.
//!
//! Every key must have a TOML-representable default (no `Option`): the defaults, serialized,
//! are the schema that unknown keys and wrong types are checked against.

use super::choices::*;
use serde::{Deserialize, Serialize};

/// One source of a dataset mixture (`[[training.datasets]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSpec {
    /// A file, folder or glob of corpus files (as `training.dataset_path`).
    pub path: String,
    /// Its share of the samples, in any scale (> 0).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

macro_rules! section {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty = $default:expr),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name { $($(#[$fm])* pub $field: $ty),* }
        impl Default for $name {
            fn default() -> Self { Self { $($field: $default),* } }
        }
    };
}

section!(Job {
    /// Folder for metrics, checkpoints and the loss curve.
    dump_folder: String = "./outputs".into(),
    description: String = String::new(),
    /// Print the effective config at start.
    print_config: bool = false,
});

section!(Model {
    name: ModelName = ModelName::Llama3,
    /// A flavor of the `name` family (llama3: tiny | debugmodel | small | 1B | 3B | 8B | 70B | 405B |
    /// moe_debug | moe_1B; qwen3 and deepseek_v3: see the README) | hf (the shape from
    /// `hf_assets_path`/config.json, a Hugging Face model of that family)
    flavor: String = "debugmodel".into(),
    /// Folder holding `tokenizer.json` (and `config.json` for `flavor = "hf"`).
    hf_assets_path: String = "assets/tokenizer".into(),
    /// A `tokenizer.json` path; overrides `hf_assets_path` when set.
    tokenizer_path: String = String::new(),
    /// auto (fused on the CPU; on GPUs the faster of fused and Burn's, measured per shape, for
    /// attention and the MoE grouped GEMM) | fused (titan-rs kernel where the device has it) |
    /// reference (Burn's attention)
    attention: AttentionChoice = AttentionChoice::Auto,
    /// RMSNorm, SwiGLU, RoPE and cross-entropy: fused (CubeCL kernels on GPU devices) | reference
    kernels: KernelChoice = KernelChoice::Fused,
    /// causal | block_causal (TorchTitan's key): with block_causal a token attends only to
    /// earlier tokens of its own document in a packed row (documents end with the tokenizer's
    /// end-of-text token)
    attn_mask_type: MaskType = MaskType::Causal,
    /// With block_causal: RoPE positions restart at 0 with each document (titan-rs key; false
    /// counts positions from the row's start, as TorchTitan does)
    rope_per_document: bool = false,
    /// MoE flavors: the aux-loss-free balancing bias step per optimizer step (TorchTitan's
    /// `load_balance_coeff`; 0 turns balancing off; -1 keeps the flavor's, 1e-3)
    moe_load_balance_coeff: f64 = -1.0,
    /// MoE flavors: weight α of DeepSeek-V3's sequence-wise balance loss (0 = off, the
    /// flavors' default; CPU device; -1 keeps the flavor's)
    moe_aux_loss_alpha: f64 = -1.0,
});

/// One optimizer parameter group (`[[optimizer.param_groups]]`, TorchTitan's regex groups): the
/// parameters whose name (`layers.3.attention.wq.weight`, as checkpoints store it) the regex
/// `pattern` finds take the group's settings; the first matching group wins, unset ones keep
/// the section's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamGroup {
    pub pattern: String,
    /// AdamW | Muon (Muon takes matrices only: 2-D, or 3-D stacked experts, one matrix each).
    #[serde(default)]
    pub optimizer: Option<OptimizerName>,
    #[serde(default)]
    pub lr: Option<f64>,
    #[serde(default)]
    pub weight_decay: Option<f64>,
}

section!(Optimizer {
    /// AdamW | Muon (Muon for the hidden matrices, AdamW for embeddings, norms, the output head
    /// and everything not 2-D, unless `param_groups` say otherwise)
    name: OptimizerName = OptimizerName::AdamW,
    lr: f64 = 8e-4,
    betas: Vec<f64> = vec![0.9, 0.95],
    eps: f64 = 1e-8,
    weight_decay: f64 = 0.1,
    /// Muon's momentum μ (PyTorch `torch.optim.Muon`'s `momentum`).
    muon_momentum: f64 = 0.95,
    /// Muon: Nesterov momentum (the update is g + μ·B instead of B).
    muon_nesterov: bool = true,
    /// Muon: Newton–Schulz iterations.
    muon_ns_steps: usize = 5,
    /// Muon: the quintic Newton–Schulz coefficients (a, b, c).
    muon_ns_coefficients: Vec<f64> = vec![3.4445, -4.7750, 2.0315],
    /// Muon: the floor of the Frobenius norm the update is divided by before the iterations.
    muon_eps: f64 = 1e-7,
    /// match_rms_adamw | original
    muon_adjust_lr_fn: MuonAdjustLr = MuonAdjustLr::MatchRmsAdamw,
    /// Parameter groups (`[[optimizer.param_groups]]` with `pattern` and any of `optimizer`,
    /// `lr`, `weight_decay`).
    param_groups: Vec<ParamGroup> = Vec::new(),
});

section!(LrScheduler {
    warmup_steps: u64 = 200,
    /// Fraction of `training.steps` spent decaying; -1 = all steps after warmup.
    decay_ratio: f64 = -1.0,
    /// linear | sqrt | cosine
    decay_type: DecayType = DecayType::Linear,
    min_lr_factor: f64 = 0.0,
});

section!(Training {
    /// Built-in corpus name (shakespeare) or any name when `dataset_path` is set.
    dataset: String = "shakespeare".into(),
    /// A text/JSONL file or folder; overrides the built-in dataset.
    dataset_path: String = String::new(),
    /// The JSON field holding each document's text in `.jsonl[.gz|.zst]` files.
    dataset_text_column: String = "text".into(),
    /// The id type of pre-tokenized `.bin` files: "uint16" (nanoGPT) or "uint32".
    dataset_token_dtype: TokenDtype = TokenDtype::U16,
    /// A mixture (`[[training.datasets]]` with `path` and `weight`); when set it replaces
    /// `dataset`/`dataset_path`.
    datasets: Vec<DatasetSpec> = Vec::new(),
    local_batch_size: usize = 8,
    /// -1 = local_batch_size × data-parallel degree (no accumulation).
    global_batch_size: i64 = -1,
    seq_len: usize = 256,
    /// Global gradient-norm clipping; <= 0 disables.
    max_norm: f64 = 1.0,
    steps: u64 = 10_000,
    seed: u64 = 42,
    /// cpu (Burn flex) | wgpu | vulkan (build with --features wgpu) | cuda (--features cuda)
    device: DeviceKind = DeviceKind::Cpu,
    /// Which adapter of that kind (GPUs are counted per kind: discrete, then integrated); -1 =
    /// one GPU per rank: the rank with local rank r on its host takes adapter r mod adapters.
    device_index: i64 = -1,
    /// float32
    dtype: ParamDtype = ParamDtype::Float32,
    /// The compute type: float32 | bfloat16 | float16 (float32 master weights and optimizer state)
    mixed_precision_param: Precision = Precision::Float32,
    /// With float16 compute: dynamic (GradScaler's rule: skip an overflowing step and halve the
    /// scale, double it after `loss_scale_growth_interval` clean steps) | none
    loss_scale: LossScaleMode = LossScaleMode::Dynamic,
    /// The first loss scale (float16, dynamic)
    loss_scale_init: f64 = 65536.0,
    /// Clean steps in a row before the loss scale doubles
    loss_scale_growth_interval: u64 = 2000,
    /// Where tokenized corpora are cached.
    cache_dir: String = ".cache/titan-rs".into(),
    /// CPU threads for the math (0 = all cores).
    threads: usize = 0,
    /// Refuse a job whose planned peak (`titan-rs plan`) exceeds the host's available memory
    /// (CPU) or the GPU's memory, before allocating anything.
    memory_check: bool = true,
    /// The GPU's memory in GiB for the fit check; 0 = ask the driver (nvidia-smi, amdgpu sysfs).
    device_memory_gib: f64 = 0.0,
});

section!(Parallelism {
    data_parallel_replicate_degree: usize = 1,
    /// -1 = all remaining ranks.
    data_parallel_shard_degree: i64 = -1,
    fsdp_reshard_after_forward: ReshardAfterForward = ReshardAfterForward::Default,
    /// Run FSDP's all-gathers and gradient reduce-scatters on a background communication
    /// stream, hidden behind compute (prefetch, asynchronous reduce-scatter); the numbers are
    /// bit for bit those of `false`, which waits for each collective in turn.
    overlap_collectives: bool = true,
    /// With overlap: transformer blocks whose parameters are gathered ahead of the block
    /// computing (0 = each block's parameters together, when the block starts).
    fsdp_prefetch_depth: usize = 1,
    /// Gradient all-reduce bucket size in MiB (PyTorch DDP's `bucket_cap_mb`): the replicas'
    /// all-reduce runs once per bucket, with overlap as soon as a bucket's gradients are ready.
    ddp_bucket_cap_mb: usize = 25,
    tensor_parallel_degree: usize = 1,
    enable_sequence_parallel: bool = true,
    pipeline_parallel_degree: usize = 1,
    pipeline_parallel_schedule: PipelineSchedule = PipelineSchedule::OneFOneB,
    /// -1 = even automatic split.
    pipeline_parallel_layers_per_stage: i64 = -1,
    /// -1 = pipeline degree.
    num_pp_microbatches: i64 = -1,
    /// Ranks that split each sequence (ring attention; they also shard the weights with FSDP).
    context_parallel_degree: usize = 1,
    /// How K/V reach every context-parallel rank: ring (send/recv around the ring, two blocks
    /// in memory) | allgather (all at once)
    context_parallel_rotate_method: RotateMethod = RotateMethod::Ring,
    expert_parallel_degree: usize = 1,
});

section!(Checkpoint {
    enable: bool = false,
    /// Under `job.dump_folder`.
    folder: String = "checkpoint".into(),
    interval: u64 = 500,
    /// 0 = keep all.
    keep_latest_k: usize = 10,
    /// -1 = latest.
    load_step: i64 = -1,
    /// "disabled" (the save blocks training) or "async" (the state is copied to host memory and
    /// written by a background thread while training continues).
    async_mode: AsyncMode = AsyncMode::Disabled,
    /// The final step's checkpoint holds only the model (no optimizer state). TorchTitan's
    /// default is true; ours is false so that a finished run resumes when `training.steps` is
    /// raised.
    last_save_model_only: bool = false,
    /// Parts of a checkpoint not to load on resume: "model", "optimizer", "dataloader",
    /// "train_state" (the step).
    exclude_from_loading: Vec<LoadablePart> = Vec::new(),
    /// Also checkpoint after step 1.
    enable_first_step_checkpoint: bool = false,
    /// Start from these weights when the checkpoint folder has no checkpoint yet: a titan-rs
    /// step folder, or with `initial_load_in_hf` a Hugging Face model folder.
    initial_load_path: String = String::new(),
    initial_load_in_hf: bool = false,
    /// Load only the model from `initial_load_path` (fresh optimizer, step 0).
    initial_load_model_only: bool = true,
    /// Also write the last step's model as a Hugging Face folder (`step-N-hf/`).
    last_save_in_hf: bool = false,
    /// "float32" | "bfloat16": the weights' type in Hugging Face exports.
    export_dtype: ExportDtype = ExportDtype::Float32,
});

section!(Metrics {
    log_freq: u64 = 10,
    /// Peak TFLOP/s of one device for MFU; <= 0 = the CPU's arithmetic ceiling (or the GPU
    /// table by adapter name).
    peak_tflops: f64 = -1.0,
    /// Write `loss_curve.png` (loss, validation loss, lr, grad norm) at each checkpoint and at the end.
    save_loss_curve: bool = true,
    /// No colour in the console lines even on a terminal (`NO_COLOR` works too).
    disable_color_printing: bool = false,
    /// Write TensorBoard event files under `{dump_folder}/{save_tb_folder}/{UTC date-time}`.
    enable_tensorboard: bool = false,
    save_tb_folder: String = "tb".into(),
    /// TensorBoard files from every rank (`rank_N` subfolders), not only the logging rank.
    save_for_all_ranks: bool = false,
});

section!(Profiling {
    /// Record a step trace every `profile_freq` steps.
    enable_profiling: bool = false,
    /// Under `job.dump_folder`: `iteration_N/rankR_trace.json` (Chrome trace events).
    save_traces_folder: String = "profile_traces".into(),
    profile_freq: u64 = 10,
});

section!(ActivationCheckpoint {
    /// none | full | selective
    mode: AcMode = AcMode::None,
    /// With `mode = "selective"`: "N" checkpoints every N-th block.
    selective_ac_option: String = "2".into(),
});

section!(Comm {
    /// local
    backend: CommBackend = CommBackend::Local,
    /// How long a collective may wait before the job fails with a hang report, from start-up
    /// until the first training step is done (model build, checkpoint load, first step).
    init_timeout_seconds: f64 = 300.0,
    /// The same after the first training step.
    train_timeout_seconds: f64 = 100.0,
});

section!(Validation {
    enable: bool = false,
    dataset: String = "shakespeare_valid".into(),
    dataset_path: String = String::new(),
    local_batch_size: usize = 8,
    freq: u64 = 100,
    /// -1 = the whole validation set.
    steps: i64 = -1,
});

section!(Fault {
    /// Bad-step policy: a step whose loss or gradient norm is not finite skips its update
    /// (parameters and optimizer state unchanged, its batch dropped, the step counter and LR
    /// schedule advance), up to this many in a row; one more stops the run. 0: the first stops
    /// it. (float16's loss scaling skips overflowing steps on its own.)
    skip_nonfinite_steps: u32 = 0,
    /// Straggler detection: each logging window (`metrics.log_freq` steps) every rank's compute
    /// time and collective time are gathered; a rank computing slower than this many times the
    /// median of its pipeline stage (and by more than 10 ms per step) is counted. 0 = off.
    straggler_threshold: f64 = 1.5,
    /// ... for this many windows in a row: then it is named (rank, host, numbers) in the log, in
    /// `metrics.jsonl` ("stragglers") and in the step trace.
    straggler_windows: u32 = 3,
    /// Silent-data-corruption check every this many steps (0 = off): each rank runs the step's
    /// forward and backward twice more on a probe batch and compares its gradients bit for bit
    /// with itself and with its data-parallel replicas (about two more passes on those steps).
    sdc_check_interval: u64 = 0,
    /// stop | warn: what a rank found at fault does (named with its host either way).
    sdc_action: SdcAction = SdcAction::Stop,
    /// Loss-spike rollback: a step whose loss has a robust z-score (against the last
    /// `loss_spike_window` losses: median and MAD) above this is a spike; 0 = off. Needs
    /// `checkpoint.enable`.
    loss_spike_zscore: f64 = 0.0,
    loss_spike_window: usize = 100,
    /// ... this many spikes in a row roll the run back to the last checkpoint before the first
    /// of them, skipping the data read since (recorded, checkpointed, logged).
    loss_spike_steps: u32 = 1,
    /// One rollback more than this stops the run.
    max_rollbacks: u32 = 3,
});

section!(Debug {
    /// Make the loss non-finite at this step (tests the non-finite stop); -1 = never.
    inject_nonfinite_at_step: i64 = -1,
    /// Stop after this step (after its checkpoint), as if the job were interrupted; -1 = never.
    stop_at_step: i64 = -1,
    /// Print every parameter with its shape and logical axes at start.
    print_param_specs: bool = false,
    /// SIGKILL this process while the checkpoint of this step is half written (its rank file on
    /// disk, not committed; on the writer thread under async saves); -1 = never. For the
    /// crash-safety tests.
    kill_during_save_at_step: i64 = -1,
    /// Fault injection for restart tests: attempt `k` of the job (`restart_attempt`) fails at
    /// step `fail_at_steps[k]`, mid-step (after forward and backward, before the gradient
    /// reduction); attempts past the list run clean.
    fail_at_steps: Vec<u64> = Vec::new(),
    /// The world rank that fails; -1 = the last.
    fail_rank: i64 = -1,
    /// kill (SIGKILL the rank's process) | error (the rank returns an error) | hang (the rank
    /// never enters its next collective)
    fail_mode: FailMode = FailMode::Kill,
    /// A slow rank for the straggler tests: this world rank sleeps `slow_seconds` in every step's
    /// compute; -1 = none.
    slow_rank: i64 = -1,
    slow_seconds: f64 = 0.0,
    /// Spiking batches for the rollback tests: the batch each listed step reads in an
    /// uninterrupted run gets scrambled targets (a bad data window; after a rollback skips it,
    /// the step number is read from other data and is not scrambled).
    spike_at_steps: Vec<u64> = Vec::new(),
    /// Flip one bit of this world rank's gradient in the silent-data-corruption check; -1 = none.
    sdc_flip_rank: i64 = -1,
    /// transient (one of the check's two runs) | persistent (both)
    sdc_flip: SdcFlip = SdcFlip::Transient,
    /// Which attempt this is: set by `titan-rs train --max-restarts` for the jobs it restarts.
    restart_attempt: usize = 0,
});

section!(
    /// The whole job: one struct per TOML section.
    JobConfig {
        job: Job = Job::default(),
        model: Model = Model::default(),
        optimizer: Optimizer = Optimizer::default(),
        lr_scheduler: LrScheduler = LrScheduler::default(),
        training: Training = Training::default(),
        parallelism: Parallelism = Parallelism::default(),
        checkpoint: Checkpoint = Checkpoint::default(),
        metrics: Metrics = Metrics::default(),
        profiling: Profiling = Profiling::default(),
        activation_checkpoint: ActivationCheckpoint = ActivationCheckpoint::default(),
        comm: Comm = Comm::default(),
        validation: Validation = Validation::default(),
        fault: Fault = Fault::default(),
        debug: Debug = Debug::default(),
    }
);
