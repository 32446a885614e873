"""The model a run trains: references to local Hugging Face directories (`resolve`: aliases
provisioned offline, `load_causal_lm`), the cache and how an entry is built (`cache`,
`provisioning`), where the weights came from (`provenance`), any `torch.nn.Module` as the
model (`module`) and LoRA adapters on a frozen base (`adapters`).
`smollm2_tokenizer.json.zst` is the tokenizer the `tiny` alias is built with.
"""
