//! Element-wise reductions over rank contributions, in rank order (f32 accumulation for bf16).

use super::{CommError, CommResult, DType, ReduceOp};
use half::bf16;

fn to_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytemuck::pod_collect_to_vec(bytes),
        DType::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(bytes).iter().map(|x| x.to_f32()).collect(),
        DType::U8 => unreachable!("checked by the caller"),
    }
}

/// Reduces `parts` (one byte buffer per rank, rank order) into `out`.
pub fn reduce(parts: &[&[u8]], out: &mut [u8], dtype: DType, op: ReduceOp) -> CommResult<()> {
    if dtype == DType::U8 {
        return Err(CommError::Invalid("raw bytes cannot be reduced; use f32 or bf16".into()));
    }
    let mut acc = to_f32(parts[0], dtype);
    for p in &parts[1..] {
        let x = to_f32(p, dtype);
        match op {
            ReduceOp::Sum | ReduceOp::Mean => acc.iter_mut().zip(&x).for_each(|(a, b)| *a += b),
            ReduceOp::Max => acc.iter_mut().zip(&x).for_each(|(a, b)| *a = a.max(*b)),
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
