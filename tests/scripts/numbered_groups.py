"""A graph file's numbered process groups after a 2-D mesh of the same world size took the same
names (tests/test_repro_files.py), in a process of its own so that the fake world starts afresh.
Prints the size of group '1' after the mesh, of '0' and '1' after the file, and whether a mesh
made afterwards reused the names '0' or '1'.

    python -m tests.scripts.numbered_groups GRAPH.py
"""

import sys

from torch.distributed.distributed_c10d import _get_group_size_by_name

from fxglue.graph_file import load_graph
from fxglue.models.workloads import _MESH_CACHE, ensure_fake_world, mesh_groups


def main(graph: str) -> None:
    ensure_fake_world(8)
    mesh_groups("2d", 8, 2)
    print(_get_group_size_by_name("1"))
    load_graph(graph)
    print(_get_group_size_by_name("0"), _get_group_size_by_name("1"))
    _MESH_CACHE.clear()
    again = mesh_groups("2d", 8, 4)
    print(again.dp in ("0", "1") or again.tp in ("0", "1"))


if __name__ == "__main__":
    main(sys.argv[1])
