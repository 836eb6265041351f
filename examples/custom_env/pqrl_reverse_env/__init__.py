"""A pqrl environment plug-in: the model must submit a word spelled backwards."""

from env_server import Message, RewardResult, ToolEnvironment, register_environment, tool


class ReverseEnv(ToolEnvironment):
    async def reset(self, *, task, seed=None):
        self.word, self.answer = task["word"], None
        prompt = f"Spell '{self.word}' backwards, then submit it."
        return self.observation([Message(role="user", content=prompt)])

    @tool
    async def letters(self, word: str) -> str:
        """Lists the letters of a word, one per line, numbered.

        Args:
            word: the word to split.
        """
        return "\n".join(f"{i + 1}. {c}" for i, c in enumerate(word))

    @tool(final=True)
    async def submit(self, answer: str) -> str:
        """Submits the reversed word; ends the episode.

        Args:
            answer: the word spelled backwards.
        """
        self.answer = answer.strip()
        return "submitted"

    async def evaluate(self):
        return RewardResult(reward=float(self.answer == self.word[::-1]), info={"answer": self.answer})


def register():
    register_environment(
        "reverse-v1", entry_point="pqrl_reverse_env:ReverseEnv", max_turns=4, sample_task={"word": "sandbox"}
    )
