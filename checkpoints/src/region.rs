//! A box of a row-major tensor (its offset and length along every dimension) and copies between
//! buffers that hold different boxes of the same tensor: the arithmetic of resharding.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Region {
    pub offsets: Vec<usize>,
    pub lengths: Vec<usize>,
}

impl Region {
    /// The whole of a tensor of `shape`.
    pub fn full(shape: &[usize]) -> Self {
        Self { offsets: vec![0; shape.len()], lengths: shape.to_vec() }
    }

    pub fn numel(&self) -> usize {
        self.lengths.iter().product()
    }

    /// Whether the box lies inside a tensor of `shape`.
    pub fn within(&self, shape: &[usize]) -> bool {
        self.offsets.len() == shape.len()
            && self.offsets.iter().zip(&self.lengths).zip(shape).all(|((o, l), s)| o + l <= *s)
    }

    /// The common part of two boxes, if not empty.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let mut out = Region { offsets: Vec::new(), lengths: Vec::new() };
        for d in 0..self.offsets.len() {
            let lo = self.offsets[d].max(other.offsets[d]);
            let hi = (self.offsets[d] + self.lengths[d]).min(other.offsets[d] + other.lengths[d]);
            if hi <= lo {
                return None;
            }
            out.offsets.push(lo);
            out.lengths.push(hi - lo);
        }
        Some(out)
    }

    /// Row-major element index within this box of the global coordinate `at`.
    fn index_of(&self, at: &[usize]) -> usize {
        at.iter().zip(&self.offsets).zip(&self.lengths).fold(0, |i, ((a, o), l)| i * l + (a - o))
    }

    /// The contiguous runs of `part` (a sub-box of both `self` and `other`): for each,
    /// the element index in a buffer holding `self`, in one holding `other`, and the run length.
    fn runs(&self, other: &Region, part: &Region, mut each: impl FnMut(usize, usize, usize)) {
        let nd = part.offsets.len();
        if nd == 0 {
            each(0, 0, 1);
            return;
        }
        let run = part.lengths[nd - 1];
        let rows: usize = part.lengths[..nd - 1].iter().product();
        let mut at = part.offsets.clone();
        for _ in 0..rows {
            each(self.index_of(&at), other.index_of(&at), run);
            // Next row: increment the leading coordinates, last-but-one fastest.
            for d in (0..nd - 1).rev() {
                at[d] += 1;
                if at[d] < part.offsets[d] + part.lengths[d] {
                    break;
                }
                at[d] = part.offsets[d];
            }
        }
    }
}

/// How the values of a stored tensor are encoded (little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    BF16,
    F16,
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::BF16 | Elem::F16 => 2,
        }
    }
}

/// Copies the part of `src` (a buffer holding box `src_region`, float32 little-endian bytes)
/// that overlaps `dst_region` into `dst` (a buffer holding `dst_region`). Returns the elements
/// copied.
pub fn copy_overlap(src: &[u8], src_region: &Region, dst: &mut [f32], dst_region: &Region) -> usize {
    copy_overlap_as(src, Elem::F32, src_region, dst, dst_region)
}

/// [`copy_overlap`] from values stored as `elem`, widened to float32 (exactly: every bfloat16
/// and float16 value is a float32 value).
pub fn copy_overlap_as(src: &[u8], elem: Elem, src_region: &Region, dst: &mut [f32], dst_region: &Region) -> usize {
    let Some(part) = src_region.intersect(dst_region) else { return 0 };
    let k = elem.size();
    src_region.runs(dst_region, &part, |s, d, n| {
        let (bytes, out) = (&src[s * k..(s + n) * k], &mut dst[d..d + n]);
        match elem {
            Elem::F32 => {
                for (x, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *x = f32::from_le_bytes(b.try_into().unwrap());
                }
            }
            Elem::BF16 => {
                for (x, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *x = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
            }
            Elem::F16 => {
                for (x, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *x = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
        }
    });
    part.numel()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A 4×6 tensor cut into 2×3 blocks reassembles exactly; a column slice of a row block is
    /// read from the blocks that overlap it.
    #[test]
    fn blocks_reassemble_and_reslice() {
        let full: Vec<f32> = (0..24).map(|x| x as f32).collect();
        let whole = Region::full(&[4, 6]);
        let mut back = vec![f32::NAN; 24];
        let mut copied = 0;
        for r in 0..2 {
            for c in 0..2 {
                let b = Region { offsets: vec![r * 2, c * 3], lengths: vec![2, 3] };
                let mut block = vec![0f32; 6];
                copy_overlap(&bytes(&full), &whole, &mut block, &b);
                copied += copy_overlap(&bytes(&block), &b, &mut back, &whole);
            }
        }
        assert_eq!(copied, 24);
        assert_eq!(back, full);
        // Rows 1..4, columns 2..4 from the four blocks.
        let want = Region { offsets: vec![1, 2], lengths: vec![3, 2] };
        let mut got = vec![0f32; 6];
        for r in 0..2 {
            for c in 0..2 {
                let b = Region { offsets: vec![r * 2, c * 3], lengths: vec![2, 3] };
                let mut block = vec![0f32; 6];
                copy_overlap(&bytes(&full), &whole, &mut block, &b);
                copy_overlap(&bytes(&block), &b, &mut got, &want);
            }
        }
        assert_eq!(got, vec![8., 9., 14., 15., 20., 21.]);
        assert!(Region { offsets: vec![0, 3], lengths: vec![2, 3] }.intersect(&Region { offsets: vec![2, 0], lengths: vec![2, 3] }).is_none());
        assert!(want.within(&[4, 6]) && !want.within(&[4, 3]));
    }

    #[test]
    fn one_dimensional_and_scalar_regions() {
        let src = bytes(&[1., 2., 3., 4., 5.]);
        let mut dst = vec![0f32; 3];
        let n = copy_overlap(&src, &Region::full(&[5]), &mut dst, &Region { offsets: vec![3], lengths: vec![3] });
        assert_eq!((n, dst), (2, vec![4., 5., 0.]));
        let mut s = vec![0f32; 1];
        copy_overlap(&bytes(&[7.]), &Region::full(&[]), &mut s, &Region::full(&[]));
        assert_eq!(s, vec![7.]);
        // bfloat16 1.5 = 0x3fc0, float16 -2.0 = 0xc000.
        let mut w = vec![0f32; 2];
        copy_overlap_as(&[0xc0, 0x3f, 0x80, 0x3f], Elem::BF16, &Region::full(&[2]), &mut w, &Region::full(&[2]));
        assert_eq!(w, vec![1.5, 1.0]);
        copy_overlap_as(&[0x00, 0xc0], Elem::F16, &Region::full(&[1]), &mut w[..1], &Region::full(&[1]));
        assert_eq!(w[0], -2.0);
    }
}
