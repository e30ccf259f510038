"""Time of one step: the ops a micro-batch runs, what each costs on a device (measured curves
or cited defaults), the communication a layout makes, the pipeline's bubble, and what a run
of the step costs (MFU, GPU-hours). docs/time-model.md gives every term with its source.
"""
