"""A verifiers taskset whose reward needs the runtime (a file the agent wrote): not single-turn
text, so tirl's `verifiers` source refuses it."""

import verifiers.v1 as vf


class FileTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def wrote_file(self, trace: vf.Trace, runtime) -> float:
        return 1.0


class FileTaskset(vf.Taskset[FileTask, vf.TasksetConfig]):
    def load(self) -> list[FileTask]:
        return [FileTask(vf.TaskData(prompt="Write answer.txt"), self.config.task)]


__all__ = ["FileTaskset"]
