"""Robot imitation learning (issue 46): scripted-expert demonstrations in robosuite, a visuomotor
diffusion policy whose image encoder is a vitmix ViT with any token mixer, and success rates over
rollouts — the third domain of Fibottention's paper. ``vitmix robot demos | train | eval | compare``;
see ``docs/robot.md``. The simulators come from the ``[robot]`` extra (:mod:`vitmix.robot.sim`)."""
