# A backward graph as torch's save_graph_repro writes it for a CUDA run: the backward of
# fw_scalar_index.py's step (FSDP over group '0' of 8 x sequence parallel over group '1' of 8),
# hand-written at small shapes. Its buffers are made inside the graph on the GPU the run had
# (empty.memory_format, empty_strided, new_zeros, zeros, ones, full and scalar_tensor with
# device(type='cuda', index=0) or 'cuda:0'); the embedding's gradient is an index_put that
# accumulates at int64 token ids; its gradients are reduce-scattered, its TP partial sums
# all-reduced, each collective waited with wait_tensor.

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

isolate_fails_code_str = None

# torch version: 2.9.0a0+gitabcdef0
# torch cuda version: 12.8
# GPU Hardware Info:
# NVIDIA H100 80GB HBM3 : 8

from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, primals_1, primals_5, primals_6, primals_7, wait_tensor_3, view_2, relu, tangents_1):
        all_gather_into_tensor = torch.ops._c10d_functional.all_gather_into_tensor.default(tangents_1, 8, '1');  tangents_1 = None
        wait_tensor = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor);  all_gather_into_tensor = None
        convert_element_type = torch.ops.prims.convert_element_type.default(primals_7, torch.bfloat16);  primals_7 = None
        all_gather_into_tensor_1 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type, 8, '0');  convert_element_type = None
        wait_tensor_1 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_1);  all_gather_into_tensor_1 = None
        permute = torch.ops.aten.permute.default(wait_tensor, [1, 0])
        mm = torch.ops.aten.mm.default(permute, relu);  permute = None
        empty = torch.ops.aten.empty.memory_format([512, 512], dtype = torch.bfloat16, layout = torch.strided, device = device(type='cuda', index=0), pin_memory = False)
        slice_scatter = torch.ops.aten.slice_scatter.default(empty, mm, 0, 0, 512);  empty = mm = None
        convert_element_type_1 = torch.ops.prims.convert_element_type.default(slice_scatter, torch.float32);  slice_scatter = None
        reduce_scatter_tensor = torch.ops._c10d_functional.reduce_scatter_tensor.default(convert_element_type_1, 'avg', 8, '0');  convert_element_type_1 = None
        mm_1 = torch.ops.aten.mm.default(wait_tensor, wait_tensor_1);  wait_tensor_1 = None
        le = torch.ops.aten.le.Scalar(relu, 0);  relu = None
        scalar_tensor = torch.ops.aten.scalar_tensor.default(0.0, dtype = torch.bfloat16, layout = torch.strided, device = device(type='cuda', index=0))
        where = torch.ops.aten.where.self(le, scalar_tensor, mm_1);  le = scalar_tensor = mm_1 = None
        convert_element_type_2 = torch.ops.prims.convert_element_type.default(primals_6, torch.bfloat16);  primals_6 = None
        all_gather_into_tensor_2 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_2, 8, '0');  convert_element_type_2 = None
        wait_tensor_2 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_2);  all_gather_into_tensor_2 = None
        permute_1 = torch.ops.aten.permute.default(where, [1, 0])
        mm_2 = torch.ops.aten.mm.default(permute_1, view_2);  permute_1 = view_2 = None
        empty_strided = torch.ops.aten.empty_strided.default([512, 512], [1, 512], dtype = torch.bfloat16, layout = torch.strided, device = device(type='cuda', index=0), pin_memory = False)
        copy = torch.ops.aten.copy.default(empty_strided, mm_2);  empty_strided = mm_2 = None
        convert_element_type_3 = torch.ops.prims.convert_element_type.default(copy, torch.float32);  copy = None
        reduce_scatter_tensor_1 = torch.ops._c10d_functional.reduce_scatter_tensor.default(convert_element_type_3, 'avg', 8, '0');  convert_element_type_3 = None
        mm_3 = torch.ops.aten.mm.default(where, wait_tensor_2);  where = wait_tensor_2 = None
        new_zeros = torch.ops.aten.new_zeros.default(mm_3, [512], dtype = torch.float32, layout = torch.strided, device = device(type='cuda', index=0), pin_memory = False)
        ones = torch.ops.aten.ones.default([512], dtype = torch.float32, layout = torch.strided, device = 'cuda:0', pin_memory = False)
        convert_element_type_4 = torch.ops.prims.convert_element_type.default(mm_3, torch.float32)
        sum_1 = torch.ops.aten.sum.dim_IntList(convert_element_type_4, [0]);  convert_element_type_4 = None
        add = torch.ops.aten.add.Tensor(new_zeros, sum_1);  new_zeros = sum_1 = None
        mul = torch.ops.aten.mul.Tensor(add, ones);  add = ones = None
        all_reduce = torch.ops._c10d_functional.all_reduce.default(mul, 'sum', '1');  mul = None
        wait_tensor_9 = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        convert_element_type_5 = torch.ops.prims.convert_element_type.default(primals_5, torch.bfloat16);  primals_5 = None
        all_gather_into_tensor_3 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_5, 8, '0');  convert_element_type_5 = None
        wait_tensor_4 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_3);  all_gather_into_tensor_3 = None
        permute_2 = torch.ops.aten.permute.default(mm_3, [1, 0])
        mm_4 = torch.ops.aten.mm.default(permute_2, wait_tensor_3);  permute_2 = wait_tensor_3 = None
        convert_element_type_6 = torch.ops.prims.convert_element_type.default(mm_4, torch.float32);  mm_4 = None
        reduce_scatter_tensor_2 = torch.ops._c10d_functional.reduce_scatter_tensor.default(convert_element_type_6, 'avg', 8, '0');  convert_element_type_6 = None
        mm_5 = torch.ops.aten.mm.default(mm_3, wait_tensor_4);  mm_3 = wait_tensor_4 = None
        view = torch.ops.aten.view.default(mm_5, [2, 64, 512]);  mm_5 = None
        lt = torch.ops.aten.lt.Scalar(primals_1, 0)
        ge = torch.ops.aten.ge.Scalar(primals_1, 1024)
        bitwise_or = torch.ops.aten.bitwise_or.Tensor(lt, ge);  lt = ge = None
        unsqueeze = torch.ops.aten.unsqueeze.default(bitwise_or, -1);  bitwise_or = None
        scalar_tensor_1 = torch.ops.aten.scalar_tensor.default(0.0, dtype = torch.float32, layout = torch.strided, device = device(type='cuda', index=0))
        convert_element_type_7 = torch.ops.prims.convert_element_type.default(view, torch.float32);  view = None
        where_1 = torch.ops.aten.where.self(unsqueeze, scalar_tensor_1, convert_element_type_7);  unsqueeze = scalar_tensor_1 = convert_element_type_7 = None
        full_default = torch.ops.aten.full.default([1024, 512], 0, dtype = torch.float32, layout = torch.strided, device = device(type='cuda', index=0), pin_memory = False)
        index_put = torch.ops.aten.index_put.default(full_default, [primals_1], where_1, True);  full_default = primals_1 = where_1 = None
        zeros = torch.ops.aten.zeros.default([64], dtype = torch.float32, device = device(type='cuda', index=0), pin_memory = False)
        reduce_scatter_tensor_3 = torch.ops._c10d_functional.reduce_scatter_tensor.default(index_put, 'avg', 8, '0');  index_put = None
        wait_tensor_5 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor);  reduce_scatter_tensor = None
        wait_tensor_6 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor_1);  reduce_scatter_tensor_1 = None
        wait_tensor_7 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor_2);  reduce_scatter_tensor_2 = None
        wait_tensor_8 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor_3);  reduce_scatter_tensor_3 = None
        return (None, wait_tensor_8, None, zeros, wait_tensor_7, wait_tensor_6, wait_tensor_5, wait_tensor_9)

def load_args(reader):
    buf0 = reader.storage(None, 1024, device=device(type='cuda', index=0), dtype_hint=torch.int64)
    reader.tensor(buf0, (2, 64), dtype=torch.int64, is_leaf=True)  # primals_1
    buf1 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf1, (64, 512), is_leaf=True)  # primals_5
    buf2 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf2, (64, 512), is_leaf=True)  # primals_6
    buf3 = reader.storage(None, 131072, device=device(type='cuda', index=0))
    reader.tensor(buf3, (64, 512), is_leaf=True)  # primals_7
    buf4 = reader.storage(None, 131072, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf4, (128, 512), dtype=torch.bfloat16, is_leaf=True)  # wait_tensor_3
    buf5 = reader.storage(None, 131072, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf5, (128, 512), dtype=torch.bfloat16, is_leaf=True)  # view_2
    buf6 = reader.storage(None, 131072, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf6, (128, 512), dtype=torch.bfloat16, is_leaf=True)  # relu
    buf7 = reader.storage(None, 16384, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf7, (16, 512), dtype=torch.bfloat16, is_leaf=True)  # tangents_1
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    from torch._dynamo.repro.after_aot import setup_fake_process_groups
    setup_fake_process_groups({'0': {'size': 8, 'rank': 0}, '1': {'size': 8, 'rank': 0}})
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=False, command='run', save_dir=None, tracing_mode='real', check_str=None)
    dist.destroy_process_group()
