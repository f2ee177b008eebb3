//! The model families titan-rs trains, found by `model.name` (TorchTitan's `train_spec`
//! registry). A family is one folder under `models/src/` holding its flavors and its Hugging
//! Face adapter; the modules are the shared decoder ([`crate::decoder`]) driven by the fields
//! of [`ModelArgs`] (head width, QK-norm, experts), so their memory formula ([`ModelArgs`]'s
//! counts and the trainer's plan) and parallelism plan (the logical axes of
//! [`crate::decoder::logical_axes`]) hold for every family. Adding a family: its folder and one
//! line in [`FAMILIES`].

use crate::args::ModelArgs;
use crate::hf_config::Config;
use serde_json::Value;

/// Where a titan-rs parameter lives in a Hugging Face checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum HfTensor {
    /// One tensor; `transposed`: HF stores the matrix `[out, in]`, titan-rs `[in, out]`.
    One { name: String, transposed: bool },
    /// A matrix HF stores `[out, in]` with its outputs in another order: titan-rs output `j` is
    /// HF row `perm[j]` (DeepSeek's interleaved RoPE rows).
    Permuted { name: String, perm: Vec<usize> },
    /// Stacked routed experts `[E, in, out]`: one HF matrix `[out, in]` per expert.
    PerExpert { names: Vec<String> },
    /// Not in the HF format (the MoE balancing bias): zeros when read, must be zero when written.
    Absent,
}

/// One model family.
pub struct Family {
    /// `model.name`.
    pub name: &'static str,
    /// Its `model.flavor` names.
    pub flavors: &'static [&'static str],
    pub flavor: fn(&str) -> Option<ModelArgs>,
    /// HF `architectures` / `model_type` values it reads.
    pub architectures: &'static [&'static str],
    pub model_types: &'static [&'static str],
    /// `config.json` → arguments; errors name the field.
    pub from_hf_config: fn(&Config) -> Result<ModelArgs, String>,
    /// Arguments → `config.json` (`max_position_embeddings`, dtype name).
    pub to_hf_config: fn(&ModelArgs, usize, &str) -> Value,
    /// The HF tensor of a titan-rs parameter key (`None`: it has none).
    pub hf_tensor: fn(&ModelArgs, &str) -> Option<HfTensor>,
    /// Whether these arguments can be written in the family's HF format (the reason if not).
    pub exportable: fn(&ModelArgs) -> Result<(), String>,
}

/// Every family, by `model.name`.
pub const FAMILIES: &[&Family] = &[&crate::llama3::FAMILY, &crate::qwen3::FAMILY, &crate::deepseek_v3::FAMILY];

/// The family called `name` (`model.name`).
pub fn family(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().copied().find(|f| f.name == name)
}

/// The names of every family.
pub fn names() -> Vec<&'static str> {
    FAMILIES.iter().map(|f| f.name).collect()
}

/// The family of arguments a family made.
pub fn of(args: &ModelArgs) -> &'static Family {
    family(args.family).unwrap_or_else(|| panic!("model arguments of the unregistered family {:?}", args.family))
}

/// The family a `config.json` belongs to: the first of its `architectures` a family reads, else
/// its `model_type`; a config naming neither is read as Llama (as before families existed).
pub fn family_of_config(c: &Config) -> Result<&'static Family, String> {
    let archs = c.get("architectures").and_then(Value::as_array);
    let model_type = c.get("model_type").and_then(Value::as_str);
    let supported = || FAMILIES.iter().flat_map(|f| f.architectures.iter().copied()).collect::<Vec<_>>();
    if let Some(a) = archs {
        return a
            .iter()
            .filter_map(Value::as_str)
            .find_map(|x| FAMILIES.iter().copied().find(|f| f.architectures.contains(&x)))
            .ok_or_else(|| {
                format!(
                    "`architectures` = {} is not supported; titan-rs reads {:?}",
                    Value::Array(a.clone()),
                    supported()
                )
            });
    }
    match model_type {
        Some(t) => FAMILIES.iter().copied().find(|f| f.model_types.contains(&t)).ok_or_else(|| {
            let types: Vec<_> = FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect();
            format!("`model_type` = {t:?} is not supported; titan-rs reads {types:?}")
        }),
        None => Ok(&crate::llama3::FAMILY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flavor_of_every_family_is_consistent() {
        for f in FAMILIES {
            assert!(!f.flavors.is_empty(), "{}", f.name);
            for name in f.flavors {
                let a = (f.flavor)(name).unwrap_or_else(|| panic!("{}/{name}", f.name));
                a.validate().unwrap_or_else(|e| panic!("{}/{name}: {e}", f.name));
                assert_eq!(a.family, f.name);
                assert_eq!(of(&a).name, f.name);
            }
            assert!((f.flavor)("9T").is_none());
        }
        assert_eq!(names(), ["llama3", "qwen3", "deepseek_v3"]);
    }

    #[test]
    fn the_family_comes_from_architectures_then_model_type() {
        let c = |s: &str| crate::hf_config::parse(s).unwrap();
        assert_eq!(family_of_config(&c(r#"{"architectures": ["Qwen3MoeForCausalLM"]}"#)).unwrap().name, "qwen3");
        assert_eq!(family_of_config(&c(r#"{"model_type": "qwen3"}"#)).unwrap().name, "qwen3");
        assert_eq!(family_of_config(&c(r#"{"model_type": "llama"}"#)).unwrap().name, "llama3");
        let e = family_of_config(&c(r#"{"model_type": "gpt2"}"#)).err().unwrap();
        assert!(e.contains("\"gpt2\"") && e.contains("qwen3_moe"), "{e}");
    }
}
