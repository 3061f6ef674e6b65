"""The decode core: one draft tree per round, grown by the n-gram and mid drafters and verified by
the target in one forward.

tree (the draft tree, pure Python/NumPy), ngram and mid (the two drafters), construct (a round's D
steps), policies (who decides each step), state (the scheduler's online features), verify and
tensors (the target's tree forward), sampling, budget (the verified tree's size), decode (the
round loop and the autoregressive baseline), records and outcome (what a round and a decode report).
"""
