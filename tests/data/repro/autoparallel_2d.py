# fmt: off
# flake8: noqa
# isort: skip_file
# A forward graph as AutoParallel's overlap simulator keeps them (its repro_llama3_8b_fw_64_2d.py:
# Llama-3-8B, 64 ranks, 2-D), hand-written for bucketplan's tests at a few layers' worth of ops:
# FSDP over group '0' of 8, tensor parallel over group '1' of 8. As in AutoParallel's files the
# only tensors made inside the graph are 0-d scalars on the CPU (the embedding's out-of-range
# mask: index_put of a full([], 0) int64 scalar and of a bf16 zero), the inputs are on
# device(type='cuda', index=0), and get_pg_config() sizes the groups while
# get_colls_estimations_file() names the table of collective times beside this file.
import torch
from torch.nn import *
from torch import tensor, device


class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6):
        convert_element_type = torch.ops.prims.convert_element_type.default(primals_2, torch.bfloat16)
        all_gather_into_tensor = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type, 8, '0');  convert_element_type = None
        wait_tensor = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor);  all_gather_into_tensor = None
        lt = torch.ops.aten.lt.Scalar(primals_1, 0)
        ge = torch.ops.aten.ge.Scalar(primals_1, 2048)
        bitwise_or = torch.ops.aten.bitwise_or.Tensor(lt, ge);  lt = ge = None
        sub = torch.ops.aten.sub.Tensor(primals_1, 0)
        full_default = torch.ops.aten.full.default([], 0, dtype = torch.int64, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        index_put = torch.ops.aten.index_put.default(sub, [bitwise_or], full_default);  sub = full_default = None
        embedding = torch.ops.aten.embedding.default(wait_tensor, index_put);  wait_tensor = index_put = None
        full_default_1 = torch.ops.aten.full.default([], 0.0, dtype = torch.bfloat16, layout = torch.strided, device = device(type='cpu'), pin_memory = False)
        index_put_1 = torch.ops.aten.index_put.default(embedding, [bitwise_or], full_default_1);  embedding = bitwise_or = full_default_1 = None
        view = torch.ops.aten.view.default(index_put_1, [512, 2048]);  index_put_1 = None
        reduce_scatter_tensor = torch.ops._c10d_functional.reduce_scatter_tensor.default(view, 'sum', 8, '1');  view = None
        wait_tensor_1 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor);  reduce_scatter_tensor = None
        convert_element_type_1 = torch.ops.prims.convert_element_type.default(primals_6, torch.bfloat16)
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
        convert_element_type_4 = torch.ops.prims.convert_element_type.default(primals_3, torch.bfloat16)
        all_gather_into_tensor_3 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_4, 8, '0');  convert_element_type_4 = None
        wait_tensor_4 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_3);  all_gather_into_tensor_3 = None
        permute = torch.ops.aten.permute.default(wait_tensor_4, [1, 0]);  wait_tensor_4 = None
        mm = torch.ops.aten.mm.default(wait_tensor_3, permute);  wait_tensor_3 = permute = None
        all_reduce = torch.ops._c10d_functional.all_reduce.default(mm, 'sum', '1');  mm = None
        wait_tensor_5 = torch.ops._c10d_functional.wait_tensor.default(all_reduce);  all_reduce = None
        convert_element_type_5 = torch.ops.prims.convert_element_type.default(primals_4, torch.bfloat16)
        all_gather_into_tensor_4 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_5, 8, '0');  convert_element_type_5 = None
        wait_tensor_6 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_4);  all_gather_into_tensor_4 = None
        permute_1 = torch.ops.aten.permute.default(wait_tensor_6, [1, 0]);  wait_tensor_6 = None
        mm_1 = torch.ops.aten.mm.default(wait_tensor_5, permute_1);  permute_1 = None
        relu = torch.ops.aten.relu.default(mm_1);  mm_1 = None
        convert_element_type_6 = torch.ops.prims.convert_element_type.default(primals_5, torch.bfloat16)
        all_gather_into_tensor_5 = torch.ops._c10d_functional.all_gather_into_tensor.default(convert_element_type_6, 8, '0');  convert_element_type_6 = None
        wait_tensor_7 = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor_5);  all_gather_into_tensor_5 = None
        permute_2 = torch.ops.aten.permute.default(wait_tensor_7, [1, 0]);  wait_tensor_7 = None
        mm_2 = torch.ops.aten.mm.default(relu, permute_2);  permute_2 = None
        reduce_scatter_tensor_1 = torch.ops._c10d_functional.reduce_scatter_tensor.default(mm_2, 'sum', 8, '1');  mm_2 = None
        wait_tensor_8 = torch.ops._c10d_functional.wait_tensor.default(reduce_scatter_tensor_1);  reduce_scatter_tensor_1 = None
        add_1 = torch.ops.aten.add.Tensor(wait_tensor_1, wait_tensor_8);  wait_tensor_1 = wait_tensor_8 = None
        return (add_1, primals_1, wait_tensor_5, relu)

def load_args(reader):
    buf0 = reader.storage(None, 4096, device=device(type='cuda', index=0), dtype_hint=torch.int64)
    reader.tensor(buf0, (2, 256), dtype=torch.int64, is_leaf=True)  # primals_1
    buf1 = reader.storage(None, 2097152, device=device(type='cuda', index=0))
    reader.tensor(buf1, (256, 2048), is_leaf=True)  # primals_2
    buf2 = reader.storage(None, 2097152, device=device(type='cuda', index=0))
    reader.tensor(buf2, (256, 2048), is_leaf=True)  # primals_3
    buf3 = reader.storage(None, 2097152, device=device(type='cuda', index=0))
    reader.tensor(buf3, (256, 2048), is_leaf=True)  # primals_4
    buf4 = reader.storage(None, 2097152, device=device(type='cuda', index=0))
    reader.tensor(buf4, (256, 2048), is_leaf=True)  # primals_5
    buf5 = reader.storage(None, 1024, device=device(type='cuda', index=0))
    reader.tensor(buf5, (256,), is_leaf=True)  # primals_6

load_args._version = 0

def get_pg_config():
    return {'0': {'size': 8, 'rank': 0}, '1': {'size': 8, 'rank': 0}}

def get_colls_estimations_file():
    return "autoparallel_2d.table"
