//! Flex (CPU): a host round trip through the communicator.

use super::host::{self, Prim};
use super::CollectiveOps;
use crate::registry::with_group;
use burn::backend::ops::FloatTensorOps;
use burn::backend::{tensor::FloatTensor, Flex, TensorMetadata};
use burn::tensor::{read_sync, DType, TensorData};

impl CollectiveOps for Flex {
    fn dist_collective(x: FloatTensor<Self>, fwd: u32, _bwd: u32, dim: usize, group: u64) -> FloatTensor<Self> {
        let prim = Prim::from_code(fwd);
        if prim == Prim::Identity {
            return x;
        }
        let (dtype, device, shape) = (x.dtype(), x.device(), x.shape().to_vec());
        let data = read_sync(Flex::float_into_data(x)).expect("reading a flex tensor");
        let data = data.convert_dtype(DType::F32).try_into_vec_as::<f32>().expect("f32 data");
        let (out, out_shape) = with_group(group, |c| host::run(prim, data, &shape, dim, c));
        Flex::float_from_data(TensorData::new(out, out_shape).convert_dtype(dtype), &device)
    }
}
