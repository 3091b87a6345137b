"""The engine: request flow from GenerateInput to streamed outputs, the model, its KV, the server."""
