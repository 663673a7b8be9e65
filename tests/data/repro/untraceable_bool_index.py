# A forward graph as torch's save_graph_repro writes it for a CUDA run, hand-written for
# bucketplan's tests, that cannot be traced on fake tensors: index_1 selects rows by a bool mask,
# so its output's length depends on the data (aten.nonzero), which a trace without the data
# cannot know (torch.compile graph-breaks there unless told to capture such ops with symbolic
# sizes). bucketplan refuses it in one line naming the node and its op.

import torch
from torch import tensor, device
import torch.fx as fx
from torch._dynamo.testing import rand_strided
from math import inf
import torch._inductor.inductor_prims
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

isolate_fails_code_str = None

# torch version: 2.9.0a0+gitabcdef0
# torch cuda version: 12.8

from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, primals_1, primals_2):
        all_gather_into_tensor = torch.ops._c10d_functional.all_gather_into_tensor.default(primals_2, 8, '0');  primals_2 = None
        wait_tensor = torch.ops._c10d_functional.wait_tensor.default(all_gather_into_tensor);  all_gather_into_tensor = None
        mm = torch.ops.aten.mm.default(primals_1, wait_tensor);  wait_tensor = None
        gt = torch.ops.aten.gt.Scalar(primals_1, 0)
        any_1 = torch.ops.aten.any.dim(gt, 1);  gt = None
        index_1 = torch.ops.aten.index.Tensor(mm, [any_1]);  mm = any_1 = None
        sum_1 = torch.ops.aten.sum.default(index_1);  index_1 = None
        return (sum_1,)

def load_args(reader):
    buf0 = reader.storage(None, 65536, device=device(type='cuda', index=0))
    reader.tensor(buf0, (128, 128), is_leaf=True)  # primals_1
    buf1 = reader.storage(None, 8192, device=device(type='cuda', index=0))
    reader.tensor(buf1, (16, 128), is_leaf=True)  # primals_2
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    from torch._dynamo.repro.after_aot import setup_fake_process_groups
    setup_fake_process_groups({'0': {'size': 8, 'rank': 0}})
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=False, command='run', save_dir=None, tracing_mode='real', check_str=None)
    dist.destroy_process_group()
