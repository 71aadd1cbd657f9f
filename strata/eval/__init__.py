"""Quality measurement: per-position logprob records, teacher-forced comparisons of two configurations."""
