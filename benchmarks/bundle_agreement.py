"""Does a decode from the deployment bundle agree with the wall check's deployed row? (after `make repro`)

For each evaluated dataset of a pair, the prompts the wall_check stage decoded for real (its
Spec-Bench answers under ``wall_check.out_dir/specbench/deployed/``, or under the method's own name)
are decoded again and compared:
- with the bundle loaded by ``decoder.load_deployment`` (what a user gets from the CLI or Python);
- with the policy rebuilt from the exported student at the bundle's threshold offset
  (``decoder.deploy.deployment.threshold_variants``, the path evaluate's rows took before bundles existed).
Tokens must equal evaluate's answer text and accepted lengths per round, and the per-round
mid-call decisions of the two decodes must be identical. Prints one line per dataset and a total;
exits 1 on any disagreement.

    python benchmarks/bundle_agreement.py --pair zoo-chat-l
"""

from __future__ import annotations

import argparse
import json
import sys

from collectors.collect.plan import load_registered_pair, tree_config
from collectors.evaluation.priced_tasks import cell_inputs
from config.params import load_params, resolve
from decoder.deploy.deployment import load_deployment, threshold_variants
from decoder.generate import generate
from decoder.models.memory import configure_process
from models.offline import THRESHOLD_OFFSETS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default="zoo-chat-l")
    parser.add_argument("--deployment", default=None, help="bundle folder (default: deploy.out_dir)")
    args = parser.parse_args(argv)
    params = load_params()
    configure_process(params.runtime.torch_threads, params.runtime.keep_freed_memory)
    dep = load_deployment(args.deployment or resolve(params.deploy.out_dir), args.pair)
    tree = tree_config(params.tree)
    students = threshold_variants(
        resolve(params.export.out_dir) / "scheduler.json", tree.depth, tree.width, THRESHOLD_OFFSETS
    )
    deploys = dep.decision["deploys"]
    rebuilt = students.get(deploys, deploys)  # a fallback is a policy name (all-small, all-mid, ar)
    pair = load_registered_pair(params, args.pair)
    specbench = resolve(params.wall_check.out_dir) / "specbench"
    bad = total = 0
    for dataset in params.evaluate.datasets:
        # a deployed policy that is one of evaluate's own methods is decoded (and answered) under
        # that method's name, a shifted threshold under "deployed"
        name = f"{args.pair}__{dataset}.jsonl"
        path = next(
            (p for p in (specbench / "deployed" / name, specbench / deploys / name) if p.is_file()), None
        )
        if path is None:  # the wall check's round-robin reached no prompt of this dataset
            continue
        answers = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        questions, prompts, _, _ = cell_inputs(params, args.pair, dataset, pair, len(answers))
        same = 0
        for question, prompt, answer in zip(questions, prompts, answers, strict=True):
            assert question.question_id == answer["question_id"], (question.question_id, answer)
            got = generate(pair, prompt, dep.policy, dep.config, dep.runtime(len(prompt)), timing=False)
            ref = generate(pair, prompt, rebuilt, dep.config, dep.runtime(len(prompt)), timing=False)
            choice = answer["choices"][0]
            ok = (
                pair.tokenizer.decode(got.new_tokens) == choice["turns"][0]
                and [r.emitted for r in got.rounds] == choice["accept_lengths"][0]
                and got.new_tokens == ref.new_tokens
                and [r.mid_calls for r in got.rounds] == [r.mid_calls for r in ref.rounds]
            )
            same += ok
        total += len(answers)
        bad += len(answers) - same
        print(f"{args.pair} {dataset}: {same} of {len(answers)} prompts agree (deploys {deploys})")
    print(f"{args.pair}: {total - bad} of {total} prompts agree: tokens, accepted lengths and mid calls")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
