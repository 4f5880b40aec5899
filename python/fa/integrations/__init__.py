"""fa inside other frameworks. Each integration is imported on its own, so that fa itself needs
none of them: ``import fa.integrations.transformers``."""
