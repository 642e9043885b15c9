"""Training data with tool use: the AgentMath synthesis pipeline (`pipeline`, `stages`, `client`,
`report`; `tirl synth run`), teacher-free trajectories from RACES environments (`races`;
`tirl synth races`), and the quickstart's arithmetic demonstrations (`arithmetic`)."""
