"""Fine-tuning a frozen backbone: the methods (`methods`: plug-ins and what trains) and
storage per task (`storage`, SPARTAN App. E). Below the tasks: the classification task
(`tasks.classification`, with its pretrained backbones in `tasks.backbones`) trains them on
the engine."""
