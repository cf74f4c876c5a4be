"""Did it help? The scorers (scorers.py: each declared once, for held-out evaluation and GRPO's rewards alike) and the
held-out score of the base model, the parent adapter and the new adapter, with its plain verdict (heldout.py)."""
