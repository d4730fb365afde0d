"""The kog path's decisions and state: the gate (which server, request and step the kog path takes, each refusal a
counted reason), the model's weights as the kernel reads them, run-ahead bursts, counters and the step timeline."""
