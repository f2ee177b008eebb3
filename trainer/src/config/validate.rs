//! Value checks: each error names the key, the bad value and what is allowed.

use super::choices::*;
use super::schema::JobConfig;
use anyhow::{bail, Result};

fn one_of(errors: &mut Vec<String>, key: &str, value: &str, allowed: &[&str]) {
    if !allowed.contains(&value) {
        errors.push(format!("`{key}` = {value:?} is not supported; use one of {allowed:?}"));
    }
}

fn positive(errors: &mut Vec<String>, key: &str, value: u64) {
    if value <= 0 {
        errors.push(format!("`{key}` = {value} must be a positive integer"));
    }
}

pub fn validate(c: &JobConfig) -> Result<()> {
    let mut e = Vec::new();
    if c.model.flavor != "hf" {
        one_of(&mut e, "model.flavor", &c.model.flavor, c.model.family().flavors);
    }
    for (key, v) in [
        ("model.moe_load_balance_coeff", c.model.moe_load_balance_coeff),
        ("model.moe_aux_loss_alpha", c.model.moe_aux_loss_alpha),
    ] {
        if !(v >= 0.0 || v == -1.0) || !v.is_finite() {
            e.push(format!("`{key}` = {v} must be >= 0 (or -1 for the flavor's value)"));
        }
    }
    if c.model.rope_per_document && c.model.attn_mask_type != MaskType::BlockCausal {
        e.push("`model.rope_per_document` = true needs `model.attn_mask_type` = \"block_causal\" (documents are only tracked then)".into());
    }
    let o = &c.optimizer;
    if !(o.lr > 0.0 && o.lr.is_finite()) {
        e.push(format!("`optimizer.lr` = {} must be a positive number", o.lr));
    }
    if o.betas.len() != 2 || o.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
        e.push(format!("`optimizer.betas` = {:?} must be two numbers in [0, 1), e.g. [0.9, 0.95]", o.betas));
    }
    if !(o.eps > 0.0) {
        e.push(format!("`optimizer.eps` = {} must be > 0", o.eps));
    }
    if !(o.weight_decay >= 0.0) {
        e.push(format!("`optimizer.weight_decay` = {} must be >= 0", o.weight_decay));
    }
    if !(0.0..1.0).contains(&o.muon_momentum) {
        e.push(format!("`optimizer.muon_momentum` = {} must be in [0, 1)", o.muon_momentum));
    }
    if o.muon_ns_steps == 0 {
        e.push("`optimizer.muon_ns_steps` = 0 must be at least 1 (5 is the published choice)".into());
    }
    if o.muon_ns_coefficients.len() != 3 || o.muon_ns_coefficients.iter().any(|c| !c.is_finite()) {
        e.push(format!(
            "`optimizer.muon_ns_coefficients` = {:?} must be three numbers (a, b, c), e.g. [3.4445, -4.775, 2.0315]",
            o.muon_ns_coefficients
        ));
    }
    if !(o.muon_eps > 0.0) {
        e.push(format!("`optimizer.muon_eps` = {} must be > 0", o.muon_eps));
    }
    for (i, g) in o.param_groups.iter().enumerate() {
        if let Err(err) = regex::Regex::new(&g.pattern) {
            e.push(format!(
                "`optimizer.param_groups[{i}].pattern` = {:?} is not a regular expression: {err}",
                g.pattern
            ));
        }
        if g.lr.is_some_and(|lr| !(lr >= 0.0 && lr.is_finite())) {
            e.push(format!("`optimizer.param_groups[{i}].lr` = {:?} must be >= 0", g.lr.unwrap()));
        }
        if g.weight_decay.is_some_and(|w| !(w >= 0.0)) {
            e.push(format!("`optimizer.param_groups[{i}].weight_decay` = {:?} must be >= 0", g.weight_decay.unwrap()));
        }
    }
    let s = &c.lr_scheduler;
    if s.decay_ratio != -1.0 && !(0.0..=1.0).contains(&s.decay_ratio) {
        e.push(format!(
            "`lr_scheduler.decay_ratio` = {} must be in [0, 1], or -1 for all steps after warmup",
            s.decay_ratio
        ));
    }
    if !(0.0..=1.0).contains(&s.min_lr_factor) {
        e.push(format!("`lr_scheduler.min_lr_factor` = {} must be in [0, 1]", s.min_lr_factor));
    }
    let t = &c.training;
    positive(&mut e, "training.local_batch_size", t.local_batch_size as u64);
    positive(&mut e, "training.seq_len", t.seq_len as u64);
    positive(&mut e, "training.steps", t.steps);
    let local = t.local_batch_size.max(1) as i64;
    if t.global_batch_size != -1 && (t.global_batch_size <= 0 || t.global_batch_size % local != 0) {
        e.push(format!(
            "`training.global_batch_size` = {} must be -1 or a positive multiple of `training.local_batch_size` = {} (e.g. {})",
            t.global_batch_size, t.local_batch_size, t.local_batch_size * 2
        ));
    }
    let pd = &c.parallelism;
    let per_step = local * pd.data_parallel_replicate_degree.max(1) as i64 * pd.data_parallel_shard_degree.max(1);
    if t.global_batch_size != -1 && t.global_batch_size > 0 && t.global_batch_size % per_step != 0 {
        e.push(format!(
            "`training.global_batch_size` = {} must be a multiple of local_batch_size × data_parallel_replicate_degree × data_parallel_shard_degree = {per_step}",
            t.global_batch_size
        ));
    }
    if t.dataset_path.is_empty() && crate::paths::builtin_dataset(&t.dataset).is_none() {
        e.push(format!(
            "`training.dataset` = {:?} is not a built-in dataset (shakespeare, shakespeare_valid); set `training.dataset_path` to a text/JSONL file or folder",
            t.dataset
        ));
    }
    let p = &c.parallelism;
    if t.device_index < -1 {
        e.push(format!(
            "`training.device_index` = {} must be an adapter index, or -1 for one GPU per rank",
            t.device_index
        ));
    }
    if !(t.loss_scale_init.is_finite() && t.loss_scale_init > 0.0) {
        e.push(format!(
            "`training.loss_scale_init` = {} must be a positive number (PyTorch's default: 65536)",
            t.loss_scale_init
        ));
    }
    if t.loss_scale_growth_interval == 0 {
        e.push("`training.loss_scale_growth_interval` = 0 must be at least 1 (PyTorch's default: 2000)".to_string());
    }
    if t.mixed_precision_param.is_half() && p.tensor_parallel_degree > 1 {
        e.push(format!(
            "`training.mixed_precision_param` = {:?} with `parallelism.tensor_parallel_degree` = {} is not supported yet (the TP activation collectives move float32); use \"float32\" with TP, or mixed precision with data and pipeline parallelism",
            t.mixed_precision_param, p.tensor_parallel_degree
        ));
    }
    let k = &c.checkpoint;
    positive(&mut e, "checkpoint.interval", k.interval);
    if k.load_step < -1 {
        e.push(format!("`checkpoint.load_step` = {} must be a step number or -1 (latest)", k.load_step));
    }
    if k.folder.is_empty() {
        e.push("`checkpoint.folder` must not be empty".into());
    }
    if k.async_mode == AsyncMode::AsyncWithPinnedMem {
        e.push("`checkpoint.async_mode` = \"async_with_pinned_mem\" is not supported (the staging copy is ordinary host memory); use \"async\" or \"disabled\"".into());
    }
    for (i, d) in c.training.datasets.iter().enumerate() {
        if !(d.weight.is_finite() && d.weight > 0.0) {
            e.push(format!("`training.datasets[{i}].weight` = {} must be a positive number", d.weight));
        }
        if d.path.is_empty() {
            e.push(format!("`training.datasets[{i}].path` must not be empty"));
        }
    }
    positive(&mut e, "metrics.log_freq", c.metrics.log_freq);
    if c.metrics.enable_tensorboard && c.metrics.save_tb_folder.is_empty() {
        e.push("`metrics.save_tb_folder` must not be empty when `metrics.enable_tensorboard` is on".into());
    }
    if c.profiling.enable_profiling {
        positive(&mut e, "profiling.profile_freq", c.profiling.profile_freq);
        if c.profiling.save_traces_folder.is_empty() {
            e.push("`profiling.save_traces_folder` must not be empty".into());
        }
    }
    if let Err(m) = c.activation_checkpoint.policy() {
        e.push(m);
    }
    let f = &c.fault;
    if !(f.straggler_threshold >= 0.0 && f.straggler_threshold.is_finite())
        || (f.straggler_threshold > 0.0 && f.straggler_threshold <= 1.0)
    {
        e.push(format!(
            "`fault.straggler_threshold` = {} must be above 1 (times the median compute time), or 0 to turn straggler detection off",
            f.straggler_threshold
        ));
    }
    positive(&mut e, "fault.straggler_windows", f.straggler_windows as u64);
    if !(f.loss_spike_zscore >= 0.0 && f.loss_spike_zscore.is_finite()) {
        e.push(format!(
            "`fault.loss_spike_zscore` = {} must be a positive z-score (e.g. 6), or 0 to turn loss-spike rollback off",
            f.loss_spike_zscore
        ));
    }
    if f.loss_spike_zscore > 0.0 {
        if !c.checkpoint.enable {
            e.push("`fault.loss_spike_zscore` rolls back to checkpoints: set `checkpoint.enable` = true (or `fault.loss_spike_zscore` = 0)".to_string());
        }
        if f.loss_spike_window < 10 {
            e.push(format!("`fault.loss_spike_window` = {} must be at least 10 losses", f.loss_spike_window));
        }
        positive(&mut e, "fault.loss_spike_steps", f.loss_spike_steps as u64);
    }
    if !(c.debug.slow_seconds >= 0.0 && c.debug.slow_seconds.is_finite()) {
        e.push(format!("`debug.slow_seconds` = {} must be a non-negative number of seconds", c.debug.slow_seconds));
    }
    for (key, v) in
        [("init_timeout_seconds", c.comm.init_timeout_seconds), ("train_timeout_seconds", c.comm.train_timeout_seconds)]
    {
        if !(v > 0.0 && v.is_finite()) {
            e.push(format!("`comm.{key}` = {v} must be a positive number of seconds"));
        }
    }
    let v = &c.validation;
    if v.enable {
        positive(&mut e, "validation.local_batch_size", v.local_batch_size as u64);
        positive(&mut e, "validation.freq", v.freq);
        if v.steps == 0 || v.steps < -1 {
            e.push(format!("`validation.steps` = {} must be positive, or -1 for the whole set", v.steps));
        }
        if v.dataset_path.is_empty() && crate::paths::builtin_dataset(&v.dataset).is_none() {
            e.push(format!(
                "`validation.dataset` = {:?} is not a built-in dataset; set `validation.dataset_path`",
                v.dataset
            ));
        }
    }
    // The degrees themselves (the model × mesh rules run before training: `memory::checks`).
    if let Err(msg) = c.parallelism.dims(None) {
        e.push(msg);
    }
    if !e.is_empty() {
        bail!("invalid config:\n  - {}", e.join("\n  - "));
    }
    Ok(())
}
