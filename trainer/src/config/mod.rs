//! Configuration: schema with defaults, TOML + CLI loading, validation.

mod load;
mod schema;
mod validate;

#[cfg(test)]
mod tests;

pub use load::{load_config, parse_overrides, to_toml};
pub use schema::*;

impl Parallelism {
    /// The mesh for `world` ranks (`None`: the product of the degrees, -1 shard counting as 1).
    pub fn dims(&self, world: Option<usize>) -> Result<titan_parallel::ParallelDims, String> {
        let shard = if self.data_parallel_shard_degree > 0 { self.data_parallel_shard_degree } else { 1 };
        let product = [
            self.data_parallel_replicate_degree,
            shard,
            self.context_parallel_degree,
            self.tensor_parallel_degree,
            self.pipeline_parallel_degree,
        ]
        .iter()
        .map(|&d| d.max(1) as usize)
        .product();
        titan_parallel::ParallelDims::new(
            self.data_parallel_replicate_degree,
            self.data_parallel_shard_degree,
            self.context_parallel_degree,
            self.tensor_parallel_degree,
            self.pipeline_parallel_degree,
            self.expert_parallel_degree,
            world.unwrap_or(product),
        )
    }
}

impl Training {
    /// How the corpus files are read.
    pub fn corpus_options(&self) -> titan_data::CorpusOptions {
        titan_data::CorpusOptions { text_column: self.dataset_text_column.clone(), token_dtype: self.dataset_token_dtype.clone() }
    }
}

impl Model {
    /// The tokenizer file: `tokenizer_path`, else `hf_assets_path/tokenizer.json`.
    pub fn tokenizer_file(&self) -> std::path::PathBuf {
        if !self.tokenizer_path.is_empty() {
            crate::paths::resolve(&self.tokenizer_path)
        } else {
            crate::paths::resolve(&self.hf_assets_path).join("tokenizer.json")
        }
    }
}

impl JobConfig {
    /// The model's shape: a named flavor, or (`model.flavor = "hf"`) the `config.json` in
    /// `model.hf_assets_path`. Errors name the file and the field.
    pub fn model_args(&self) -> Result<titan_models::ModelArgs, String> {
        if self.model.flavor == "hf" {
            let p = crate::paths::resolve(&self.model.hf_assets_path).join("config.json");
            let text = std::fs::read_to_string(&p).map_err(|e| {
                format!("`model.flavor` = \"hf\" reads {}: {e}; set `model.hf_assets_path` to the folder of the model's config.json", p.display())
            })?;
            return titan_models::hf_config::from_hf_config(&text).map_err(|e| format!("{}: {e}", p.display()));
        }
        let mut args = titan_models::ModelArgs::flavor(&self.model.flavor).ok_or_else(|| {
            format!("`model.flavor` = {:?} is not a flavor; use one of {:?} or \"hf\"", self.model.flavor, titan_models::FLAVORS)
        })?;
        if let Some(m) = &mut args.moe {
            if self.model.moe_load_balance_coeff >= 0.0 {
                m.load_balance_coeff = self.model.moe_load_balance_coeff;
            }
            if self.model.moe_aux_loss_alpha >= 0.0 {
                m.aux_loss_alpha = self.model.moe_aux_loss_alpha;
            }
        }
        Ok(args)
    }

    /// Global batch in samples (resolving -1 for a single data-parallel rank).
    pub fn global_batch_size(&self, dp_degree: usize) -> usize {
        match self.training.global_batch_size {
            -1 => self.training.local_batch_size as usize * dp_degree,
            g => g as usize,
        }
    }
}

impl ActivationCheckpoint {
    /// The blocks to checkpoint; errors name the key and what is accepted.
    pub fn policy(&self) -> Result<titan_models::Checkpointing, String> {
        use titan_models::Checkpointing;
        match self.mode.as_str() {
            "none" => Ok(Checkpointing::None),
            "full" => Ok(Checkpointing::Full),
            "selective" => match self.selective_ac_option.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(if n == 1 { Checkpointing::Full } else { Checkpointing::EveryNth(n) }),
                _ if self.selective_ac_option == "op" => Ok(Checkpointing::Ops),
                _ => Err(format!(
                    "`activation_checkpoint.selective_ac_option` = {:?} is not a block frequency; use a positive integer N as a string (\"2\": every 2nd block is checkpointed) or \"op\" (keep matmul and attention outputs, recompute the element-wise ops)",
                    self.selective_ac_option
                )),
            },
            other => Err(format!(
                "`activation_checkpoint.mode` = {other:?} is not supported; use one of [\"none\", \"full\", \"selective\"]"
            )),
        }
    }
}
