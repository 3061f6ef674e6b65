"""nn.Linear run by oneDNN on the layer's own weight tensor, every weight held once.

PyTorch's inference module (torch.utils.mkldnn.MkldnnLinear) copies each weight into a oneDNN
tensor (plain row-major layout, no blocked reorder) and leaves the loaded weight alive beside it:
safetensors loads map the checkpoint file, and the norms and embeddings still reference that map,
so every linear weight sat in memory twice (the real Qwen2.5-Coder pair in fp32: 17.2 GiB RSS
against 9.6 GiB stock). ``torch._C._nn.mkldnn_linear`` takes a dense contiguous weight as well as a
oneDNN one and views it as the same plain oneDNN memory, so it runs the same inner product on the
same bits: outputs are bit-identical to MkldnnLinear's, with no second copy.

The weights are moved once into fresh allocator memory (:func:`rehome_tensors`) before the swap:
tensors mapped from a checkpoint sit at the file's offsets (8 bytes past a 64-byte line here), and
oneDNN's kernels run such rows up to 1.4x slower than 64-byte-aligned ones (3-row forwards); moving
every tensor, not only the linear weights, also lets the file mapping go, so the model is held once,
in anonymous memory. A tied LM head is the input embedding's own Parameter: the embedding lookup and
the head read one tensor.
"""

from __future__ import annotations

import torch


class OneDNNLinear(torch.nn.Module):
    """An nn.Linear's forward by oneDNN, keeping the layer's own weight and bias Parameters
    (the same objects: ties survive, state_dict and save_pretrained still see dense tensors)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_parameter("weight", linear.weight)
        self.register_parameter("bias", linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] dense (or oneDNN); y: [..., out_features] in x's layout
        y = torch._C._nn.mkldnn_linear(x if x.is_mkldnn else x.to_mkldnn(), self.weight, self.bias)
        return y if x.is_mkldnn else y.to_dense()

    def extra_repr(self) -> str:
        has_bias = self.bias is not None
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={has_bias}"


@torch.no_grad()
def rehome_tensors(model: torch.nn.Module) -> None:
    """Give every parameter and buffer of the model a contiguous copy in fresh allocator memory
    (64-byte aligned), in place, and drop the old storage: Parameters keep their identity (a tied
    head stays tied), a buffer shared by several modules stays shared. One tensor is copied at a
    time; memory the old storages held is released once nothing else refers to it."""
    for param in model.parameters():  # each Parameter once, however many modules hold it
        param.data = param.data.clone(memory_format=torch.contiguous_format)
    moved: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, buf in module.named_buffers(recurse=False):
            if id(buf) not in moved:
                moved[id(buf)] = buf.clone(memory_format=torch.contiguous_format)
            module._buffers[name] = moved[id(buf)]
