"""Model implementations: one Llama-family decoder driven by the Hugging Face config."""
