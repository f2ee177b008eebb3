//! The model × mesh checks: the config's values are checked when it is loaded
//! ([`crate::config`]); these need the model's shape and the resolved mesh — divisibility of
//! heads, experts and layers by the degrees, the pipeline layout, what each flavor supports —
//! and run before anything starts, beside the fit check. Each error names the key.

use crate::config::JobConfig;
use crate::rank::pipeline::RankLayout;
use anyhow::{bail, Result};

/// Every model × mesh rule the config breaks, in one error.
pub fn check(c: &JobConfig) -> Result<()> {
    let mut e: Vec<String> = Vec::new();
    let (t, p) = (&c.training, &c.parallelism);
    // The sequence split: CP cuts each sequence in 2·cp chunks, SP over the TP ranks.
    let (tp, cp) = (p.tensor_parallel_degree.max(1), p.context_parallel_degree.max(1));
    if cp > 1 && t.seq_len % (2 * cp) != 0 {
        e.push(format!(
            "`training.seq_len` = {} must be a multiple of 2 · `parallelism.context_parallel_degree` = {} (each context-parallel rank holds two of 2·cp equal chunks); change either",
            t.seq_len,
            2 * cp
        ));
    } else if tp > 1 && p.enable_sequence_parallel && (t.seq_len / cp) % tp != 0 {
        let what = if cp > 1 {
            format!("`training.seq_len` / `parallelism.context_parallel_degree` = {}", t.seq_len / cp)
        } else {
            format!("`training.seq_len` = {}", t.seq_len)
        };
        e.push(format!(
            "{what} must be a multiple of `parallelism.tensor_parallel_degree` = {tp} with sequence parallelism (each rank holds seq_len / cp / tp positions); change them or set `parallelism.enable_sequence_parallel` = false"
        ));
    }
    let args = match c.model_args() {
        Ok(a) => Some(a),
        Err(msg) if c.model.flavor == "hf" => {
            e.push(msg);
            None
        }
        Err(_) => None, // an unknown flavor is reported when the config is loaded
    };
    if let Some(args) = args {
        if let Err(msg) = args.validate() {
            e.push(format!("`model.flavor` = {:?}: {msg}", c.model.flavor));
        }
        if args.tie_word_embeddings && p.pipeline_parallel_degree > 1 {
            e.push(format!(
                "the model ties its output head to the embedding (`tie_word_embeddings` in {}/config.json), which `parallelism.pipeline_parallel_degree` = {} would place on different stages; use 1 (TorchTitan has the same limit)",
                c.model.hf_assets_path, p.pipeline_parallel_degree
            ));
        }
        // The mesh rules and the model's divisibility, checked before anything starts.
        let dims = p.dims(None);
        match dims {
            Ok(d) => {
                if let Err(msg) = RankLayout::new(p, &args, t.local_batch_size.max(1), 0) {
                    e.push(msg);
                }
                if let Err(msg) = d.validate_model(
                    args.n_heads,
                    args.n_kv_heads,
                    args.ffn_hidden_dim(),
                    args.vocab_size,
                    args.n_layers,
                ) {
                    e.push(msg);
                }
                let moe_key_set = c.model.moe_load_balance_coeff().is_some() || c.model.moe_aux_loss_alpha().is_some();
                if args.moe.is_none() && moe_key_set {
                    e.push(format!(
                        "`model.moe_load_balance_coeff` / `model.moe_aux_loss_alpha` apply to mixture-of-experts flavors; `model.flavor` = {:?} is dense",
                        c.model.flavor
                    ));
                }
                if args.moe.as_ref().is_some_and(|m| m.aux_loss_alpha > 0.0) && t.device.is_gpu() {
                    e.push("`model.moe_aux_loss_alpha` > 0 runs on the CPU device (the loss is attached by a CPU op); set `training.device` = \"cpu\" or the weight to 0".into());
                }
                if c.checkpoint.last_save_in_hf {
                    if let Err(why) = (titan_models::registry::of(&args).exportable)(&args) {
                        e.push(format!(
                            "`checkpoint.last_save_in_hf` = true: `model.flavor` = {:?} cannot be written in Hugging Face format: {why}; set it to false",
                            c.model.flavor
                        ));
                    }
                }
                match (&args.moe, d.ep) {
                    (None, ep) if ep > 1 => e.push(format!(
                        "`parallelism.expert_parallel_degree` = {ep} needs a mixture-of-experts model; `model.flavor` = {:?} is dense (try \"moe_debug\" or \"moe_1B\") or set the degree to 1",
                        c.model.flavor
                    )),
                    (Some(m), ep) if m.num_experts % ep != 0 => e.push(format!(
                        "`parallelism.expert_parallel_degree` = {ep} does not divide the model's {} experts; use a divisor of {}",
                        m.num_experts, m.num_experts
                    )),
                    _ => {}
                }
            }
            Err(_) => {} // reported when the config is loaded
        }
    }
    if !e.is_empty() {
        bail!("invalid config:\n  - {}", e.join("\n  - "));
    }
    Ok(())
}
