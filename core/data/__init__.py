"""Training data: reading files and Hub datasets, row formats, the row plan (which rows train, and as what), the held-out split."""
