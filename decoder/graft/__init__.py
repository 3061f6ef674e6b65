"""GRAFT's block drafting: block proposers (a trained block drafter, or a causal LM as a stand-in),
DDTree trees from their marginals, the TDES edge scorer, learned tree budgets, and the 'ddtree'
decode loop."""
