"""Optional ONNX export of an artifact head, built from the exported arrays (no torch tracing).

The graph is exactly the NumPy inference of decoder/deploy/scheduler.py in float32:
(x - x_mean) / x_std -> Gemm -> Relu -> ... -> Gemm -> * y_std + y_mean, input ``x`` (n, in),
output ``y`` (n, 1). Only the ``onnx`` package is needed to build it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def head_to_onnx(manifest: dict, arrays: dict[str, np.ndarray], head: str, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    sizes = manifest["heads"][head]
    f32 = np.float32
    inits = [
        numpy_helper.from_array(np.asarray(manifest["x_mean"], f32), "x_mean"),
        numpy_helper.from_array(np.asarray(manifest["x_std"], f32), "x_std"),
        numpy_helper.from_array(np.asarray([manifest["y_mean"][head]], f32), "y_mean"),
        numpy_helper.from_array(np.asarray([manifest["y_std"][head]], f32), "y_std"),
    ]
    nodes = [
        helper.make_node("Sub", ["x", "x_mean"], ["xc"]),
        helper.make_node("Div", ["xc", "x_std"], ["h0"]),
    ]
    n_layers = len(sizes) - 1
    for i in range(n_layers):
        w, b = f"{head}.{i}.weight", f"{head}.{i}.bias"
        inits += [
            numpy_helper.from_array(arrays[w].astype(f32), w),
            numpy_helper.from_array(arrays[b].astype(f32), b),
        ]
        out = f"g{i}" if i < n_layers - 1 else "out"
        nodes.append(helper.make_node("Gemm", [f"h{i}", w, b], [out], transB=1))
        if i < n_layers - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{i + 1}"]))
    nodes += [
        helper.make_node("Mul", ["out", "y_std"], ["ys"]),
        helper.make_node("Add", ["ys", "y_mean"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        f"treegraft_{manifest['kind']}_{head}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    """(n,) outputs of an exported head with onnxruntime on CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": np.asarray(x, dtype=np.float32)})[0][:, 0].astype(np.float64)
