"""A small single-turn verifiers taskset, written as docs/v1/tasksets.md shows (loaded by its
id `vf-addition-test`, through verifiers' own loader)."""

import verifiers.v1 as vf


class AdditionData(vf.TaskData):
    answer: int


class AdditionTask(vf.Task[AdditionData]):
    @vf.reward
    async def exact_match(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.split()[-1:] == [str(self.data.answer)])


class AdditionConfig(vf.TasksetConfig):
    num_tasks: int = 50


class AdditionTaskset(vf.Taskset[AdditionTask, AdditionConfig]):
    def load(self) -> list[AdditionTask]:
        return [
            AdditionTask(AdditionData(prompt=f"What is {i} + {i}?", answer=2 * i), self.config.task)
            for i in range(self.config.num_tasks)
        ]


__all__ = ["AdditionTaskset"]
