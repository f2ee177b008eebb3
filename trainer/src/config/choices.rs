//! The enumerated keys: each a serde enum whose TOML spelling is TorchTitan's, parsed once when
//! the config is loaded (a bad value is refused there, naming the key and the accepted values),
//! so no component compares strings.

use serde::{Deserialize, Serialize};

/// An enum of config values: `$text` is the value as written in TOML and on the command line.
macro_rules! choice {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }
        impl $name {
            /// Every accepted value, in the order the README lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The value as written in the config.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }
        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    format!("{s:?} is not supported; use one of {:?}", Self::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>())
                })
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

choice!(
    /// `model.name`: the model family (`titan_models::registry`).
    ModelName { Llama3 = "llama3", Qwen3 = "qwen3", DeepseekV3 = "deepseek_v3" }
);

choice!(
    /// `model.kernels`: titan-rs's fused kernels or Burn's composed ops.
    KernelChoice { Fused = "fused", Reference = "reference" }
);

impl KernelChoice {
    pub fn is_fused(self) -> bool {
        self == KernelChoice::Fused
    }
}

choice!(
    /// `model.attention`: `auto` — titan-rs's fused kernel on the CPU, on GPU devices the faster of
    /// it and Burn's attention, measured per shape at first use; `fused`; `reference` (Burn's).
    AttentionChoice { Auto = "auto", Fused = "fused", Reference = "reference" }
);

impl AttentionChoice {
    /// Whether titan-rs's kernel may run (`auto` or `fused`); Burn's otherwise.
    pub fn is_fused(self) -> bool {
        self != AttentionChoice::Reference
    }
}

choice!(
    /// `training.loss_scale`: float16's dynamic loss scaling, or none.
    LossScaleMode { Dynamic = "dynamic", None = "none" }
);

choice!(
    /// `model.attn_mask_type`.
    MaskType { Causal = "causal", BlockCausal = "block_causal" }
);

choice!(
    /// `optimizer.name`.
    OptimizerName { AdamW = "AdamW", Muon = "Muon" }
);

choice!(
    /// `optimizer.muon_adjust_lr_fn`: how Muon scales the learning rate by the matrix shape
    /// (PyTorch's `torch.optim.Muon` `adjust_lr_fn`): `match_rms_adamw` = 0.2·√max(A, B)
    /// (Moonlight: the update's RMS matches AdamW's, so both share lr and weight decay);
    /// `original` = √max(1, A/B) (Keller Jordan's), A = fan-out, B = fan-in.
    MuonAdjustLr { MatchRmsAdamw = "match_rms_adamw", Original = "original" }
);

choice!(
    /// `lr_scheduler.decay_type`.
    DecayType { Linear = "linear", Sqrt = "sqrt", Cosine = "cosine" }
);

choice!(
    /// `training.device`: the Burn device kind every rank computes on.
    DeviceKind { Cpu = "cpu", Wgpu = "wgpu", Vulkan = "vulkan", Cuda = "cuda" }
);

impl DeviceKind {
    pub fn is_gpu(self) -> bool {
        self != DeviceKind::Cpu
    }
}

choice!(
    /// `training.dtype`: the parameters' (master weights') type.
    ParamDtype { Float32 = "float32" }
);

choice!(
    /// `training.mixed_precision_param`: the compute type (float32 master weights and optimizer
    /// state either way).
    Precision { Float32 = "float32", BFloat16 = "bfloat16", Float16 = "float16" }
);

impl Precision {
    /// Bytes of one element in this type.
    pub fn bytes(self) -> u64 {
        match self {
            Precision::Float32 => 4,
            Precision::BFloat16 | Precision::Float16 => 2,
        }
    }

    /// Burn's type for it.
    pub fn dtype(self) -> burn::tensor::DType {
        match self {
            Precision::Float32 => burn::tensor::DType::F32,
            Precision::BFloat16 => burn::tensor::DType::BF16,
            Precision::Float16 => burn::tensor::DType::F16,
        }
    }

    pub fn is_half(self) -> bool {
        self != Precision::Float32
    }
}

choice!(
    /// `parallelism.fsdp_reshard_after_forward` (TorchTitan's values): free each gathered
    /// parameter after forward and gather it again in backward; `default` = `always` except under
    /// pipeline parallelism (each microbatch's backward would gather again).
    ReshardAfterForward { Default = "default", Always = "always", Never = "never" }
);

impl ReshardAfterForward {
    /// Whether gathered parameters are freed after forward, with `pipeline` stages or not.
    pub fn reshards(self, pipeline: bool) -> bool {
        match self {
            ReshardAfterForward::Default => !pipeline,
            ReshardAfterForward::Always => true,
            ReshardAfterForward::Never => false,
        }
    }
}

choice!(
    /// `parallelism.context_parallel_rotate_method`.
    RotateMethod { Ring = "ring", AllGather = "allgather" }
);

impl RotateMethod {
    pub fn rotate(self) -> titan_parallel::cp::Rotate {
        match self {
            RotateMethod::Ring => titan_parallel::cp::Rotate::Ring,
            RotateMethod::AllGather => titan_parallel::cp::Rotate::AllGather,
        }
    }
}

choice!(
    /// `parallelism.pipeline_parallel_schedule`.
    PipelineSchedule { GPipe = "GPipe", OneFOneB = "1F1B", Interleaved1F1B = "Interleaved1F1B" }
);

impl PipelineSchedule {
    pub fn schedule(self) -> titan_parallel::pp::Schedule {
        use titan_parallel::pp::Schedule;
        match self {
            PipelineSchedule::GPipe => Schedule::GPipe,
            PipelineSchedule::OneFOneB => Schedule::OneFOneB,
            PipelineSchedule::Interleaved1F1B => Schedule::Interleaved1F1B,
        }
    }
}

choice!(
    /// `checkpoint.async_mode` (TorchTitan's values; "async_with_pinned_mem" is refused by
    /// validation, with the reason).
    AsyncMode { Disabled = "disabled", Async = "async", AsyncWithPinnedMem = "async_with_pinned_mem" }
);

choice!(
    /// `checkpoint.exclude_from_loading`: the parts of a checkpoint a resume may skip.
    LoadablePart { Model = "model", Optimizer = "optimizer", Dataloader = "dataloader", TrainState = "train_state" }
);

choice!(
    /// `checkpoint.export_dtype`: the weights' type in Hugging Face exports.
    ExportDtype { Float32 = "float32", BFloat16 = "bfloat16" }
);

choice!(
    /// `activation_checkpoint.mode`.
    AcMode { None = "none", Full = "full", Selective = "selective" }
);

choice!(
    /// `comm.backend`.
    CommBackend { Local = "local" }
);

choice!(
    /// `fault.sdc_action`: what a silent-data-corruption finding does.
    SdcAction { Stop = "stop", Warn = "warn" }
);

choice!(
    /// `debug.sdc_flip`: the injected corruption — in one of the check's two runs (`transient`)
    /// or in both (`persistent`).
    SdcFlip { Transient = "transient", Persistent = "persistent" }
);

choice!(
    /// `debug.fail_mode`: how an injected failure fails.
    FailMode { Kill = "kill", Error = "error", Hang = "hang" }
);

/// `training.dataset_token_dtype`: the data crate's own enum.
pub use titan_data::TokenDtype;
