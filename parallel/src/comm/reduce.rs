//! Element-wise reductions over rank contributions, in rank order (f32 accumulation for bf16).

use super::{CommError, CommResult, DType, ReduceOp};
use half::bf16;

/// Element `i` of a little-endian buffer of `dtype`, as f32 (no allocation).
#[inline]
fn get(bytes: &[u8], dtype: DType, i: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
        DType::BF16 => bf16::from_le_bytes(bytes[2 * i..2 * i + 2].try_into().unwrap()).to_f32(),
        DType::U8 => unreachable!("checked by the caller"),
    }
}

/// Reduces `parts` (one byte buffer per rank, rank order) into `out`: the first part is the start
/// value and the others are combined in rank order, in f32 (so bf16 sums are accumulated in f32).
pub fn reduce(parts: &[&[u8]], out: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    if dtype == DType::U8 {
        return Err(CommError::Invalid("raw bytes cannot be reduced; use f32 or bf16".into()));
    }
    let n = out.len() / dtype.size();
    let mut acc: Vec<f32> = (0..n).map(|i| get(parts[0], dtype, i)).collect();
    for p in &parts[1..] {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc.iter_mut().enumerate().for_each(|(i, a)| *a += get(p, dtype, i)),
            ReduceOp::Max => acc.iter_mut().enumerate().for_each(|(i, a)| *a = a.max(get(p, dtype, i))),
        }
    }
    if op == ReduceOp::Mean {
        let n = parts.len() as f32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
    match dtype {
        DType::F32 => out.copy_from_slice(bytemuck::cast_slice(&acc)),
        DType::BF16 => {
            let h: Vec<bf16> = acc.iter().map(|&x| bf16::from_f32(x)).collect();
            out.copy_from_slice(bytemuck::cast_slice(&h));
        }
        DType::U8 => unreachable!(),
    }
    Ok(())
}
