//! Named f32 host tensors and their safetensors encoding.

use anyhow::{bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Tensors by name (module path), sorted.
pub type TensorMap = BTreeMap<String, HostTensor>;

/// Encodes tensors (f32, little-endian) with string metadata as safetensors bytes.
pub fn save_tensors(tensors: &TensorMap, metadata: HashMap<String, String>) -> Result<Vec<u8>> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, t)| (k.clone(), t.shape.clone(), t.data.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views = bytes
        .iter()
        .map(|(k, s, b)| Ok((k.as_str(), TensorView::new(Dtype::F32, s.clone(), b)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    Ok(safetensors::serialize(views, &Some(metadata))?)
}

/// Decodes safetensors bytes read from `path` (named in every error).
pub fn load_tensors(path: &Path, bytes: &[u8]) -> Result<(TensorMap, HashMap<String, String>)> {
    let st = SafeTensors::deserialize(bytes)
        .with_context(|| format!("{} is not a valid safetensors file", path.display()))?;
    let (_, meta) = SafeTensors::read_metadata(bytes)?;
    let mut out = TensorMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!("{}: tensor {name} has dtype {:?}; titan-rs checkpoints hold float32", path.display(), view.dtype());
        }
        let data = view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        out.insert(name, HostTensor { shape: view.shape().to_vec(), data });
    }
    Ok((out, meta.metadata().clone().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_is_bit_exact() {
        let mut m = TensorMap::new();
        m.insert(
            "a.weight".into(),
            HostTensor { shape: vec![2, 2], data: vec![1.0, -0.0, f32::MIN_POSITIVE, 3.5e-12] },
        );
        m.insert("b".into(), HostTensor { shape: vec![1], data: vec![7.0] });
        let meta = HashMap::from([("step".to_string(), "3".to_string())]);
        let bytes = save_tensors(&m, meta.clone()).unwrap();
        let (back, meta2) = load_tensors(Path::new("x"), &bytes).unwrap();
        assert_eq!(meta, meta2);
        for (k, t) in &m {
            let b = &back[k];
            assert_eq!(t.shape, b.shape);
            assert!(t.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
        let e = load_tensors(Path::new("m.safetensors"), &bytes[..bytes.len() / 2]).err().unwrap().to_string();
        assert!(e.contains("m.safetensors"), "{e}");
    }
}
