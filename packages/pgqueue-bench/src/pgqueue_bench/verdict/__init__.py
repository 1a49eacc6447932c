"""The evidence a run is judged by (the audit trail, the recorded deliveries and
acknowledged enqueues, the jobs table) and the at-least-once verdict drawn from it."""
