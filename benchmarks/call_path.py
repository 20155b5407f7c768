"""Host time per call (issue 17) on one GPU, for whichever portable_softmax is first on the path:
``bench --eager``'s table for ours and the peers named, and the time of one CUDA-graph replay of a
64x4096 call. Usage: python3 benchmarks/call_path.py OUT_JSON [peer ...]. `bash benchmarks/device.sh
call-path` runs it for this tree and for a base tree (ab_base/) in one device call."""
import json
import sys

import torch

import portable_softmax
from portable_softmax import host_time


def graph_replay_us(shape=(64, 4096), dtype=torch.bfloat16, replays=1000) -> float:
    x = torch.randn(shape, device="cuda", dtype=dtype)
    portable_softmax.softmax(x, -1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        portable_softmax.softmax(x, -1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = portable_softmax.softmax(x, -1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-2)
    return host_time.per_call_us(graph.replay, replays, torch.cuda.synchronize)


if __name__ == "__main__":
    results = host_time.run(host_time.SHAPES, [torch.bfloat16, torch.float32], set(sys.argv[2:]), calls=300)
    results["graph_replay_us_64x4096_bf16"] = graph_replay_us()
    results["package"] = portable_softmax.__file__
    with open(sys.argv[1], "w") as handle:
        json.dump(results, handle, indent=1)
    print(results["package"])
    print(host_time.table(results))
    print(f"graph replay of a 64x4096 bf16 call: {results['graph_replay_us_64x4096_bf16']:.2f} us")
