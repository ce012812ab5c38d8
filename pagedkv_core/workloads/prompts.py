"""Short chat questions used wherever real text is generated: the pages' real-model scenarios,
the throughput benchmark and the tests."""

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Explain what a CPU does in one sentence.",
    "Give me a short tip for learning to cook.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Suggest a name for a friendly robot.",
    "How do plants make food?",
    "What does a librarian do?",
    "List two benefits of walking every day.",
    "What is the boiling point of water at sea level?",
    "Describe a cat to someone who has never seen one.",
    "Why do we have seasons?",
    "What is a good way to start a story?",
    "Translate 'good morning' into Spanish.",
]
