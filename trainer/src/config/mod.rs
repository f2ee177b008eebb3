//! Configuration: schema with defaults, TOML + CLI loading, validation.

mod choices;
mod load;
mod resolved;
mod schema;
mod validate;

#[cfg(test)]
mod tests;

pub use choices::*;
pub use load::{load_config, parse_overrides, to_toml};
pub use schema::*;

impl Parallelism {
    /// The mesh for `world` ranks (`None`: the product of the degrees, -1 shard counting as 1).
    pub fn dims(&self, world: Option<usize>) -> Result<titan_parallel::ParallelDims, String> {
        let product = [
            self.data_parallel_replicate_degree,
            self.shard_degree().unwrap_or(1),
            self.context_parallel_degree,
            self.tensor_parallel_degree,
            self.pipeline_parallel_degree,
        ]
        .iter()
        .map(|&d| d.max(1))
        .product();
        titan_parallel::ParallelDims::new(
            self.data_parallel_replicate_degree as i64,
            self.data_parallel_shard_degree,
            self.context_parallel_degree as i64,
            self.tensor_parallel_degree as i64,
            self.pipeline_parallel_degree as i64,
            self.expert_parallel_degree as i64,
            world.unwrap_or(product),
        )
    }
}

impl Training {
    /// How the corpus files are read.
    pub fn corpus_options(&self) -> titan_data::CorpusOptions {
        titan_data::CorpusOptions {
            text_column: self.dataset_text_column.clone(),
            token_dtype: self.dataset_token_dtype,
        }
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

impl Model {
    /// The family `model.name` names.
    pub fn family(&self) -> &'static titan_models::Family {
        titan_models::registry::family(self.name.as_str()).expect("every `model.name` choice is a registered family")
    }
}

/// The family of the HF model folder `dir` (from its `config.json`), as a `model.name`.
pub fn hf_model_name(dir: &std::path::Path) -> Result<ModelName, String> {
    let p = dir.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("reading {}: {e}", p.display()))?;
    let c = titan_models::hf_config::parse(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    let f = titan_models::registry::family_of_config(&c).map_err(|e| format!("{}: {e}", p.display()))?;
    f.name.parse()
}

impl JobConfig {
    /// The model's shape: a flavor of the `model.name` family, or (`model.flavor = "hf"`) the
    /// `config.json` in `model.hf_assets_path`, which must be a model of that family. Errors
    /// name the file, the key and the fix.
    pub fn model_args(&self) -> Result<titan_models::ModelArgs, String> {
        let family = self.model.family();
        let mut args = if self.model.flavor == "hf" {
            let p = crate::paths::resolve(&self.model.hf_assets_path).join("config.json");
            let text = std::fs::read_to_string(&p).map_err(|e| {
                format!("`model.flavor` = \"hf\" reads {}: {e}; set `model.hf_assets_path` to the folder of the model's config.json", p.display())
            })?;
            let args = titan_models::hf_config::from_hf_config(&text).map_err(|e| format!("{}: {e}", p.display()))?;
            if args.family != family.name {
                return Err(format!(
                    "{} holds a {} model but `model.name` = {:?}; set `model.name` = {:?}",
                    p.display(),
                    args.family,
                    family.name,
                    args.family
                ));
            }
            args
        } else {
            (family.flavor)(&self.model.flavor).ok_or_else(|| {
                format!(
                    "`model.flavor` = {:?} is not a {} flavor; use one of {:?} or \"hf\"",
                    self.model.flavor, family.name, family.flavors
                )
            })?
        };
        if let Some(m) = &mut args.moe {
            if let Some(c) = self.model.moe_load_balance_coeff() {
                m.load_balance_coeff = c;
            }
            if let Some(a) = self.model.moe_aux_loss_alpha() {
                m.aux_loss_alpha = a;
            }
        }
        Ok(args)
    }
}

impl ActivationCheckpoint {
    /// The blocks to checkpoint; errors name the key and what is accepted.
    pub fn policy(&self) -> Result<titan_models::Checkpointing, String> {
        use titan_models::Checkpointing;
        match self.mode {
            AcMode::None => Ok(Checkpointing::None),
            AcMode::Full => Ok(Checkpointing::Full),
            AcMode::Selective => match self.selective_ac_option.trim().parse::<usize>() {
                Ok(n) if n >= 1 => Ok(if n == 1 { Checkpointing::Full } else { Checkpointing::EveryNth(n) }),
                _ if self.selective_ac_option == "op" => Ok(Checkpointing::Ops),
                _ => Err(format!(
                    "`activation_checkpoint.selective_ac_option` = {:?} is not a block frequency; use a positive integer N as a string (\"2\": every 2nd block is checkpointed) or \"op\" (keep matmul and attention outputs, recompute the element-wise ops)",
                    self.selective_ac_option
                )),
            },
        }
    }
}
