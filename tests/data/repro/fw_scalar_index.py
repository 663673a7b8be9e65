# A forward graph as torch's save_graph_repro writes it for a CUDA run (TORCHDYNAMO_REPRO_AFTER=aot):
# Llama-shaped, 2-D over 64 ranks (FSDP over group '0' of 8, tensor/sequence parallel over group
# '1' of 8). Hand-written for bucketplan's tests at small shapes. What it carries that a graph
# traced on this CPU does not: device literals of a GPU run (device(type='cuda', index=0),
# 'cuda:0', device(type='cuda', index=3)), tensors made inside the graph (full, arange,
# scalar_tensor), the scalar index_put of an embedding's out-of-range mask (a 0-d int64 tensor
# made by full on the CPU, as AOT autograd writes it), int64 indexing (index.Tensor) and a bool
# mask (masked_fill).

import os
os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/tmp/torchinductor_user'
os.environ.pop('TORCHDYNAMO_REPRO_AFTER', None)
os.environ.pop('TORCHDYNAMO_REPRO_LEVEL', None)

import torch
from torch import tensor, device
import torch.fx as fx
from torch._dynamo.testing import rand_strided
from math import inf
import torch._inductor.inductor_prims
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import torch._dynamo.config
import torch._inductor.config
import torch._functorch.config
import torch.fx.experimental._config
torch._inductor.config.reorder_for_compute_comm_overlap = True
torch._functorch.config.unlift_effect_tokens = True

isolate_fails_code_str = None

# torch version: 2.9.0a0+gitabcdef0
# torch cuda version: 12.8
# CUDA Info:
# nvcc: NVIDIA (R) Cuda compiler driver
# GPU Hardware Info:
# NVIDIA H100 80GB HBM3 : 8

from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7):
        convert_element_type = torch.ops.prims.convert_element_type.default(primals_2, torch.bfloat16)
        all_gather_into_tensor = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type, 8, '0');  convert_element_type = None
        wait_tensor = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor);  all_gather_into_tensor = None
        lt = torch.ops.aten.lt.Scalar(primals_1, 0)
        ge = torch.ops.aten.ge.Scalar(primals_1, 1024)
        bitwise_or = torch.ops.aten.bitwise_or.Tensor(lt, ge);  lt = ge = None
        sub = torch.ops.aten.sub.Tensor(primals_1, 0)
        full_default = torch.ops.aten.full.default([], 0, dtype = torch.int64, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        index_put = torch.ops.aten.index_put.default(sub, [bitwise_or], full_default);  sub = full_default = None
        embedding = torch.ops.aten.embedding.default(wait_tensor, index_put);  wait_tensor = index_put = None
        full_default_1 = torch.ops.aten.full.default([], 0.0, dtype = torch.bfloat16, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        index_put_1 = torch.ops.aten.index_put.default(embedding, [bitwise_or], full_default_1);  embedding = bitwise_or = full_default_1 = None
        view = torch.ops.aten.view.default(index_put_1, [128, 512]);  index_put_1 = None
        reduce_scatter_tensor = torch.ops._c10d_functional.reduce_scatter_tensor.default(view, 'sum', 8, '1');  view = None
        wait_tensor_1 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor);  reduce_scatter_tensor = None
        convert_element_type_1 = torch.ops.prims.convert_element_type.default(primals_4, torch.bfloat16)
        all_gather_into_tensor_1 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_1, 8, '0');  convert_element_type_1 = None
        wait_tensor_2 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_1);  all_gather_into_tensor_1 = None
        convert_element_type_2 = torch.ops.prims.convert_element_type.default(wait_tensor_1, torch.float32)
        pow_1 = torch.ops.aten.pow.Tensor_Scalar(convert_element_type_2, 2)
        mean = torch.ops.aten.mean.dim(pow_1, [1], True);  pow_1 = None
        add = torch.ops.aten.add.Scalar(mean, 1e-05);  mean = None
        rsqrt = torch.ops.aten.rsqrt.default(add);  add = None
        mul = torch.ops.aten.mul.Tensor(convert_element_type_2, rsqrt);  convert_element_type_2 = rsqrt = None
        mul_1 = torch.ops.aten.mul.Tensor(mul, wait_tensor_2);  mul = wait_tensor_2 = None
        convert_element_type_3 = torch.ops.prims.convert_element_type.default(mul_1, torch.bfloat16);  mul_1 = None
        all_gather_into_tensor_2 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_3, 8, '1');  convert_element_type_3 = None
        wait_tensor_3 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_2);  all_gather_into_tensor_2 = None
        convert_element_type_4 = torch.ops.prims.convert_element_type.default(primals_5, torch.bfloat16)
        all_gather_into_tensor_3 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_4, 8, '0');  convert_element_type_4 = None
        wait_tensor_4 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_3);  all_gather_into_tensor_3 = None
        permute = torch.ops.aten.permute.default(wait_tensor_4, [1, 0]);  wait_tensor_4 = None
        mm = torch.ops.aten.mm.default(wait_tensor_3, permute);  permute = None
        view_1 = torch.ops.aten.view.default(mm, [2, 64, 512]);  mm = None
        permute_1 = torch.ops.aten.permute.default(view_1, [0, 2, 1])
        bmm = torch.ops.aten.bmm.default(view_1, permute_1);  permute_1 = None
        arange = torch.ops.aten.arange.start(0, 64, device = 'cuda:0', pin_memory = False)
        unsqueeze = torch.ops.aten.unsqueeze.default(arange, 0)
        unsqueeze_1 = torch.ops.aten.unsqueeze.default(arange, 1)
        gt = torch.ops.aten.gt.Tensor(unsqueeze, unsqueeze_1);  unsqueeze = unsqueeze_1 = None
        masked_fill = torch.ops.aten.masked_fill.Scalar(bmm, gt, -inf);  bmm = gt = None
        _softmax = torch.ops.aten._softmax.default(masked_fill, -1, False);  masked_fill = None
        bmm_1 = torch.ops.aten.bmm.default(_softmax, view_1);  _softmax = view_1 = None
        index = torch.ops.aten.index.Tensor(primals_3, [arange]);  arange = None
        convert_element_type_5 = torch.ops.prims.convert_element_type.default(index, torch.bfloat16);  index = None
        scalar_tensor = torch.ops.aten.scalar_tensor.default(0.5, dtype = torch.bfloat16, layout = torch.strided, device = device(type='cuda', index=0))
        mul_2 = torch.ops.aten.mul.Tensor(convert_element_type_5, scalar_tensor);  convert_element_type_5 = scalar_tensor = None
        add_1 = torch.ops.aten.add.Tensor(bmm_1, mul_2);  bmm_1 = mul_2 = None
        view_2 = torch.ops.aten.view.default(add_1, [128, 512]);  add_1 = None
        convert_element_type_6 = torch.ops.prims.convert_element_type.default(primals_6, torch.bfloat16)
        all_gather_into_tensor_4 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_6, 8, '0');  convert_element_type_6 = None
        wait_tensor_5 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_4);  all_gather_into_tensor_4 = None
        permute_2 = torch.ops.aten.permute.default(wait_tensor_5, [1, 0]);  wait_tensor_5 = None
        mm_1 = torch.ops.aten.mm.default(view_2, permute_2);  permute_2 = None
        relu = torch.ops.aten.relu.default(mm_1);  mm_1 = None
        convert_element_type_7 = torch.ops.prims.convert_element_type.default(primals_7, torch.bfloat16)
        all_gather_into_tensor_5 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_7, 8, '0');  convert_element_type_7 = None
        wait_tensor_6 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_5);  all_gather_into_tensor_5 = None
        permute_3 = torch.ops.aten.permute.default(wait_tensor_6, [1, 0]);  wait_tensor_6 = None
        mm_2 = torch.ops.aten.mm.default(relu, permute_3);  permute_3 = None
        reduce_scatter_tensor_1 = torch.ops._c10d_functional.reduce_scatter_tensor.default(mm_2, 'sum', 8, '1');  mm_2 = None
        wait_tensor_7 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor_1);  reduce_scatter_tensor_1 = None
        add_2 = torch.ops.aten.add.Tensor(wait_tensor_1, wait_tensor_7);  wait_tensor_1 = wait_tensor_7 = None
        return (add_2, primals_1, primals_5, wait_tensor_3, view_2, relu)

def load_args(reader):
    buf0 = reader.storage(None, 1024, device=device(type='cuda', index=0), dtype_hint=torch.int64)
    reader.tensor(buf0, (2, 64), dtype=torch.int64, is_leaf=True)  # primals_1
    buf1 = reader.storage(None, 262144, device=device(type='cuda', index=0))
    reader.tensor(buf1, (128, 512), requires_grad=True, is_leaf=True)  # primals_2
    buf2 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf2, (64, 512), is_leaf=True)  # primals_3
    buf3 = reader.storage(None, 256, device=device(type='cuda', index=3))
    reader.tensor(buf3, (64,), requires_grad=True, is_leaf=True)  # primals_4
    buf4 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf4, (64, 512), requires_grad=True, is_leaf=True)  # primals_5
    buf5 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf5, (64, 512), requires_grad=True, is_leaf=True)  # primals_6
    buf6 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf6, (64, 512), requires_grad=True, is_leaf=True)  # primals_7
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    from torch._dynamo.repro.after_aot import setup_fake_process_groups
    setup_fake_process_groups({'0': {'size': 8, 'rank': 0}, '1': {'size': 8, 'rank': 0}})
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=False, command='run', save_dir=None, tracing_mode='real', check_str=None)
        # To run it separately, do
        # mod, args = run_repro(mod, load_args, accuracy=False, command='get_args', save_dir=None, tracing_mode='real', check_str=None)
        # mod(*args)
    dist.destroy_process_group()
