//! Parameter groups: which optimizer, learning rate and weight decay each parameter takes.
//!
//! TorchTitan's regex `param_groups`: a group's `pattern` is searched in the parameter's name
//! as checkpoints store it (`layers.3.attention.wq.weight`, `tok_embeddings.weight`); the first
//! group that matches sets what it names, the `[optimizer]` section the rest. With
//! `optimizer.name = "Muon"`, the hidden matrices take Muon by default and everything else
//! (embeddings, the output head, norms, biases) AdamW — Moonlight's and Keller Jordan's split.

use crate::config::{Optimizer, OptimizerName};
use regex::Regex;

/// What one parameter takes. `lr` is its base learning rate: the schedule scales it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub optimizer: OptimizerName,
    pub lr: f64,
    pub weight_decay: f64,
}

pub struct ParamGroups {
    groups: Vec<(Regex, crate::config::ParamGroup)>,
    default: OptimizerName,
    lr: f64,
    weight_decay: f64,
}

/// Whether Muon takes a parameter by default: a matrix (2-D, or 3-D stacked experts, each
/// expert's matrix orthogonalised on its own) that is not the embedding or the output head.
pub fn muon_by_default(name: &str, ndim: usize) -> bool {
    let head = name.starts_with("tok_embeddings.") || name.starts_with("output.");
    (ndim == 2 || ndim == 3) && !head
}

impl ParamGroups {
    pub fn new(o: &Optimizer) -> Result<Self, String> {
        let groups = o
            .param_groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                Regex::new(&g.pattern)
                    .map(|r| (r, g.clone()))
                    .map_err(|e| format!("`optimizer.param_groups[{i}].pattern` = {:?}: {e}", g.pattern))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { groups, default: o.name, lr: o.lr, weight_decay: o.weight_decay })
    }

    /// The settings of the parameter called `name` with `ndim` dimensions.
    pub fn settings(&self, name: &str, ndim: usize) -> Result<Settings, String> {
        let by_default = match self.default {
            OptimizerName::Muon if muon_by_default(name, ndim) => OptimizerName::Muon,
            _ => OptimizerName::AdamW,
        };
        let mut s = Settings { optimizer: by_default, lr: self.lr, weight_decay: self.weight_decay };
        let Some((i, (_, g))) = self.groups.iter().enumerate().find(|(_, (r, _))| r.is_match(name)) else {
            return Ok(s);
        };
        s.optimizer = g.optimizer.unwrap_or(by_default);
        s.lr = g.lr.unwrap_or(s.lr);
        s.weight_decay = g.weight_decay.unwrap_or(s.weight_decay);
        if s.optimizer == OptimizerName::Muon && !(2..=3).contains(&ndim) {
            return Err(format!(
                "`optimizer.param_groups[{i}]` (pattern {:?}) gives Muon to {name}, which has {ndim} dimension(s); Muon orthogonalises matrices only: narrow the pattern or set its `optimizer = \"AdamW\"`",
                g.pattern
            ));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ParamGroup;

    fn cfg(name: OptimizerName, groups: Vec<ParamGroup>) -> Optimizer {
        Optimizer { name, param_groups: groups, ..Optimizer::default() }
    }

    #[test]
    fn muon_takes_hidden_matrices_and_groups_override_in_order() {
        let g = ParamGroups::new(&cfg(OptimizerName::Muon, Vec::new())).unwrap();
        let kind = |n: &str, d: usize| g.settings(n, d).unwrap().optimizer;
        assert_eq!(kind("layers.0.attention.wq.weight", 2), OptimizerName::Muon);
        assert_eq!(kind("layers.1.moe.experts.w1", 3), OptimizerName::Muon);
        assert_eq!(kind("layers.0.attention_norm.weight", 1), OptimizerName::AdamW);
        assert_eq!(kind("tok_embeddings.weight", 2), OptimizerName::AdamW);
        assert_eq!(kind("output.weight", 2), OptimizerName::AdamW);
        let groups = vec![
            ParamGroup { pattern: r"\.wo\.".into(), optimizer: None, lr: Some(1e-3), weight_decay: Some(0.0) },
            ParamGroup {
                pattern: "attention".into(),
                optimizer: Some(OptimizerName::AdamW),
                lr: None,
                weight_decay: None,
            },
        ];
        let g = ParamGroups::new(&cfg(OptimizerName::Muon, groups)).unwrap();
        let wo = g.settings("layers.0.attention.wo.weight", 2).unwrap();
        assert_eq!((wo.optimizer, wo.lr, wo.weight_decay), (OptimizerName::Muon, 1e-3, 0.0));
        let wq = g.settings("layers.0.attention.wq.weight", 2).unwrap();
        assert_eq!((wq.optimizer, wq.lr, wq.weight_decay), (OptimizerName::AdamW, 8e-4, 0.1));
        let bad = vec![ParamGroup {
            pattern: "norm".into(),
            optimizer: Some(OptimizerName::Muon),
            lr: None,
            weight_decay: None,
        }];
        let e = ParamGroups::new(&cfg(OptimizerName::AdamW, bad)).unwrap().settings("norm.weight", 1).unwrap_err();
        assert!(e.contains("param_groups[0]") && e.contains("norm.weight") && e.contains("matrices only"), "{e}");
        let e = ParamGroups::new(&cfg(
            OptimizerName::AdamW,
            vec![ParamGroup { pattern: "(".into(), optimizer: None, lr: None, weight_decay: None }],
        ))
        .err()
        .unwrap();
        assert!(e.contains("param_groups[0].pattern"), "{e}");
    }
}
