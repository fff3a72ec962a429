"""Fine-tuning a frozen backbone: the methods (`methods`: plug-ins and what trains), the
pretrained backbones (`backbones`) and storage per task (`storage`, SPARTAN App. E). The
classification task (`training.tasks.classification`) trains them on the engine."""
