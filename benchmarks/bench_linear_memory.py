"""Resident memory of a model loaded with stock and with oneDNN linear kernels, each in a fresh process.

Usage:
    .venv/bin/python benchmarks/bench_linear_memory.py [--model DIR] [--dtype float32]
        [--hidden 1024] [--intermediate 2816] [--layers 12] [--heads 16] [--kv-heads 4]
        [--vocab 32000] [--untied] [--context 64] [--decode-tokens 8] [--threads 2]
        [--out artifacts/bench/linear_memory.json]

Without --model, a randomly initialised Qwen2-architecture model is built from the shape flags
(seeded, nothing downloaded; the defaults make 168 M parameters, 672 MB in fp32, with the LM head
tied to the input embedding as in Qwen2.5-Coder 0.5B/1.5B) and saved to a temporary folder. With
--model, that local model folder is measured (e.g. a real pair's target).

Each kernel runs in its own fresh Python process (glibc keeping freed memory, as the decoder CLI
does): load as decoder.models.pair.load_causal_lm loads (stock; `linear: onednn`; and for comparison
"onednn-copy", torch.utils.mkldnn.MkldnnLinear, the oneDNN path before the weights were held once,
which copies every linear weight), then prefill --context tokens and decode --decode-tokens tokens
greedily, so that every weight page has been read as in real decoding. Printed per kernel: RSS after
loading, steady RSS after decoding (its file-mapped and anonymous parts: safetensors weights are
mapped from the checkpoint), peak RSS (VmHWM), and each one's ratio to stock. Linux only (reads
/proc/self/status).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch.utils.mkldnn import MkldnnLinear
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from decoder.core.tensors import causal_block, forward_block
from decoder.models.memory import configure_process
from decoder.models.pair import load_causal_lm

KERNELS = ("stock", "onednn", "onednn-copy")
STATUS_KEYS = {"VmRSS": "rss", "VmHWM": "peak", "RssAnon": "anon", "RssFile": "file"}


def memory_mib() -> dict[str, float]:
    """This process's resident memory in MiB: rss, peak (high-water mark), anon and file parts."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            out[STATUS_KEYS[key]] = int(value.split()[0]) / 1024  # reported in kB
    return out


def copy_to_mkldnn(model: torch.nn.Module) -> None:
    """The oneDNN swap as it was before weights were held once: every nn.Linear replaced by torch's
    MkldnnLinear, which copies the weight into a oneDNN tensor (the reference for the old RSS)."""
    swaps = [(p, n, c) for p in model.modules() for n, c in p.named_children() if type(c) is torch.nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, MkldnnLinear(child, model.dtype))


def measure(path: Path, kernel: str, dtype: str, context: int, decode_tokens: int) -> dict:
    """Load the model with one kernel, decode greedily, return memory after each step and the tokens."""
    model = load_causal_lm(path, dtype, linear="stock" if kernel == "onednn-copy" else kernel)
    if kernel == "onednn-copy":
        copy_to_mkldnn(model)
    gc.collect()
    loaded = memory_mib()
    vocab = model.config.vocab_size
    prompt = [(7 * i + 3) % vocab for i in range(context)]  # any fixed ids: memory, not text, is measured
    cache, tokens = DynamicCache(), []
    logits = forward_block(model, cache, causal_block(prompt, 0, 0), logits_to_keep=1)
    for pos in range(context, context + decode_tokens):
        tokens.append(int(logits[-1].argmax()))
        logits = forward_block(model, cache, causal_block(tokens[-1:], pos, pos), logits_to_keep=1)
    gc.collect()
    return {"loaded": loaded, "steady": memory_mib(), "tokens": tokens}


def build_model(args: argparse.Namespace, folder: Path) -> Path:
    """A seeded random Qwen2-architecture model of the flags' shape, saved under folder."""
    config = Qwen2Config(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        vocab_size=args.vocab,
        tie_word_embeddings=not args.untied,
        max_position_embeddings=max(2048, args.context + args.decode_tokens),
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(getattr(torch, args.dtype))
    model.save_pretrained(folder)
    return folder


def run_child(path: Path, kernel: str, args: argparse.Namespace) -> dict:
    """measure() in a fresh interpreter, so no kernel's allocations or mappings leak into another's."""
    cmd = [sys.executable, __file__, "--child", kernel, "--model", str(path), "--dtype", args.dtype,
           "--context", str(args.context), "--decode-tokens", str(args.decode_tokens),
           "--threads", str(args.threads)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the {kernel} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: dict[str, dict], args: argparse.Namespace, source: str) -> dict:
    base = results["stock"]
    print(f"{source} ({args.dtype}); {args.context}-token prefill + {args.decode_tokens} decoded tokens; MiB")
    print(f"{'kernel':<12} {'loaded':>8} {'steady':>8} {'(file':>7} {'anon)':>7} {'peak':>8}"
          f" {'steady/stock':>13} {'peak/stock':>11}  tokens = stock's")  # fmt: skip
    rows = {}
    for kernel, r in results.items():
        steady, peak = r["steady"]["rss"], r["steady"]["peak"]
        ratios = {"steady_ratio": steady / base["steady"]["rss"], "peak_ratio": peak / base["steady"]["peak"]}
        rows[kernel] = {**r, **ratios}
        print(f"{kernel:<12} {r['loaded']['rss']:8.0f} {steady:8.0f} {r['steady']['file']:7.0f}"
              f" {r['steady']['anon']:7.0f} {peak:8.0f} {rows[kernel]['steady_ratio']:13.3f}"
              f" {rows[kernel]['peak_ratio']:11.3f}  {r['tokens'] == base['tokens']}")  # fmt: skip
    return {"model": source, "dtype": args.dtype, "context": args.context,
            "decode_tokens": args.decode_tokens, "kernels": rows}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a local model folder (default: build a random Qwen2)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    for flag, default in (("hidden", 1024), ("intermediate", 2816), ("layers", 12), ("heads", 16),
                          ("kv-heads", 4), ("vocab", 32000)):  # fmt: skip
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--untied", action="store_true", help="give the random model its own LM head")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench/linear_memory.json"))
    parser.add_argument("--child", choices=KERNELS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.context < 1 or args.decode_tokens < 1:
        parser.error("--context and --decode-tokens must be at least 1")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: not a model folder (no config.json)")
    if not Path("/proc/self/status").is_file():
        parser.error("this benchmark reads /proc/self/status: it runs on Linux only")
    return args


def main() -> None:
    args = parse_args()
    if args.child is not None:
        configure_process(args.threads, keep_freed=True)
        print(json.dumps(measure(args.model, args.child, args.dtype, args.context, args.decode_tokens)))
        return
    with tempfile.TemporaryDirectory(prefix="bench_linear_memory_") as tmp:
        path = args.model or build_model(args, Path(tmp) / "model")
        source = str(args.model) if args.model else f"random Qwen2 (d={args.hidden}, {args.layers} layers, " \
            f"vocab {args.vocab}, {'untied' if args.untied else 'tied'} head)"  # fmt: skip
        results = {kernel: run_child(path, kernel, args) for kernel in KERNELS}
    out = report(results, args, source)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
