"""The checklist as the course chapter words it (shared/seeds: chapter 3 in Portuguese and in French)."""

CHAPTER_PT = ["Use QLoRA (quantização em 4 bits)", "Ative gradient checkpointing", "Use gradient accumulation",
              "Use otimizador 8 bits ou paginado", "Use precisão bfloat16", "Reduza o max_seq_length se possível",
              "Use batches menores"]
CHAPTER_FR = ["Utiliser QLoRA (quantification 4 bits)", "Activer le checkpointing de gradient",
              "Utiliser l'accumulation de gradient", "Utiliser un optimiseur 8 bits ou paginé",
              "Utiliser la précision bfloat16", "Réduire max_seq_length si possible",
              "Utiliser des tailles de lot plus petites"]
