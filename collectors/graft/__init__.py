"""GRAFT's evaluation: edge collection, DDTree walks, measured round costs, learned budgets."""
