"""What the catalog means: where the error is born, the root-cause advisor and its rules,
logits per token, token inputs, bad cases."""
