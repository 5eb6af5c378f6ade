tools: list[object] = []
